"""``legato view``: a static HTML report of one run directory (opens from disk, no server).

Layout of the report directory (default ``<run dir>/report``)::

    index.html               every rollout: filter by task and status, sort by reward, pages of 200
    rollouts/<id>.html       one page per execution: each step's screenshot with its actions drawn
    groups/<id>.html         one page per GRPO group: its attempts side by side
    thumbs/<sha>.jpg         small first/last screenshots for the group pages (made once)

Screenshots are referenced from the run directory's ``images/`` by relative path (no copies),
unless ``self_contained`` copies the ones used into ``<report>/images/``. The index is written
first (it reads only the records), then the pages.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..record import STATUSES, TIME_PHASES, Record
from ..store.export import group_advantages
from ..store.rundir import read_meta, read_typed_records
from .marks import marks_for, screen_size, short
from .templates import environment

INDEX = "index.html"
PAGE_SIZE = 200
"""Index rows per page."""
THUMB_WIDTH = 320
"""Thumbnail width [px] (JPEG, ~10 KB)."""


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`write_report` wrote: the report directory, its index, how many rollout and
    group pages, and the seconds the index and the whole report took."""

    out: Path
    index: Path
    rollouts: int
    groups: int
    index_s: float
    total_s: float

    def rollout_page(self, rollout_id: str) -> Path:
        """The page of one execution."""
        return self.out / "rollouts" / f"{safe_name(rollout_id)}.html"

    def group_page(self, group_id: str) -> Path:
        """The page of one GRPO group."""
        return self.out / "groups" / f"{safe_name(group_id)}.html"


def attempt_summary(r, advantages: dict) -> dict:
    """What the index and a group page show of one rollout: id, attempt, execution, status,
    reward, advantage, steps and seconds (the attempt's own: reset + steps + grading, queue
    time excluded, :attr:`~legato_pipelines.record.Timing.attempt_s`)."""
    return {
        "id": r.rollout_id,
        "attempt": r.attempt,
        "execution": r.execution,
        "status": r.status,
        "reward": r.reward,
        "advantage": advantages.get(r.rollout_id),
        "steps": r.n_steps or len(r.steps),
        "seconds": r.timing.attempt_s,
    }


def safe_name(name: str) -> str:
    """A file name for an id: kept when it is plain, else made plain and suffixed with a hash
    (two ids never share a page)."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]
    if plain == name:
        return name
    return f"{plain}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def png_size(path: Path) -> tuple[int, int] | None:
    """Width and height from a PNG's header (no decoding), ``None`` when not a PNG."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


def group_key(record: Record) -> str:
    """The GRPO group an execution belongs to (its ``group_id``, else its task)."""
    return record.group_id or record.task_id


_INSTRUCTION = re.compile(r"Instruction: (.*?)(?:\n\n|$)", re.DOTALL)


def _prompt_instruction(run_dir: Path, record: Record) -> str | None:
    """The instruction as the prompt of the record's first step states it (the harness writes
    ``Instruction: ...``), else ``None``."""
    for step in record.steps[:1]:
        for sha in step.request:
            try:
                message = orjson.loads((run_dir / "messages" / f"{sha}.json").read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            content = message.get("content") if isinstance(message, dict) else None
            parts = content if isinstance(content, list) else [{"text": content}]
            for part in parts:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str) and (match := _INSTRUCTION.search(text)):
                    return match.group(1).strip()
    return None


def _instructions(
    meta: dict[str, Any], run_dir: Path, records: list[Record]
) -> dict[str, tuple[str, str | None]]:
    """``task_id -> (instruction, evaluator func)``: from the run's task list when it is an
    inline list still on disk, else the instruction from a first prompt (best effort: the
    report does not need it)."""
    out: dict[str, tuple[str, str | None]] = {}
    path = meta.get("tasks_path")
    if path:
        out.update(_task_list_facts(path, run_dir))
    for r in records:
        if r.task_id not in out and (text := _prompt_instruction(run_dir, r)):
            out[r.task_id] = (text, None)
    return out


def _task_list_facts(path: str, run_dir: Path) -> dict[str, tuple[str, str | None]]:
    candidates = [Path(path)]  # absolute, or relative to where collect ran (often here)
    if not candidates[0].is_absolute():
        candidates.append(run_dir / path)
    tasks: Any = None
    for candidate in candidates:
        try:
            tasks = orjson.loads(candidate.read_bytes())
            break
        except (OSError, orjson.JSONDecodeError):
            continue
    out = {}
    for task in tasks if isinstance(tasks, list) else []:
        config = task.get("config") if isinstance(task, dict) else None
        if isinstance(config, dict) and task.get("task_id"):
            evaluator = config.get("evaluator") or {}
            func = evaluator.get("func") if isinstance(evaluator, dict) else None
            out[task["task_id"]] = (
                config.get("instruction") or "",
                ", ".join(func) if isinstance(func, list) else func,
            )
    return out


class _Images:
    """Where pages find screenshots: the run directory's ``images/`` by relative path, or a
    copy in the report (``self_contained``); thumbnails made once per image."""

    def __init__(self, run_dir: Path, out: Path, self_contained: bool):
        self.source = run_dir / "images"
        self.out = out
        self.self_contained = self_contained
        self.dir = out / "images" if self_contained else self.source
        self.thumbs = out / "thumbs"
        self.rel = {}

    def path(self, sha: str) -> Path:
        """The screenshot's file in the run directory."""
        return self.source / f"{sha}.png"

    def href(self, sha: str, page_dir: Path) -> str:
        """The screenshot's URL relative to a page in ``page_dir``."""
        if self.self_contained:
            target = self.dir / f"{sha}.png"
            if not target.exists() and self.path(sha).exists():
                self.dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.path(sha), target)
        key = page_dir
        if key not in self.rel:
            self.rel[key] = Path(os.path.relpath(self.dir, page_dir)).as_posix()
        return f"{self.rel[key]}/{sha}.png"

    def thumb(self, sha: str) -> Path | None:
        """Make ``thumbs/<sha>.jpg`` (THUMB_WIDTH wide) if missing; ``None`` when the image is
        missing or not readable."""
        target = self.thumbs / f"{sha}.jpg"
        if target.exists():
            return target
        made = make_thumbnail(self.path(sha), THUMB_WIDTH)
        if made is None:
            return None
        self.thumbs.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(made)
        os.replace(tmp, target)
        return target


def make_thumbnail(path: Path, width: int = THUMB_WIDTH, quality: int = 70) -> bytes | None:
    """A JPEG of the screenshot at ``path``, ``width`` pixels wide; ``None`` when it cannot be
    read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            factor = max(1, im.width // (width * 2))
            small = im.reduce(factor) if factor > 1 else im
            height = max(1, round(small.height * width / small.width))
            small = small.convert("RGB").resize((width, height), Image.Resampling.BILINEAR)
    except (OSError, UnidentifiedImageError, ValueError):
        return None
    import io

    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=quality, optimize=True)
    return buffer.getvalue()


def _index_rows(
    records: list[Record], advantages: dict[str, float]
) -> tuple[list[dict[str, Any]], dict[str, list[Record]]]:
    rows = []
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        group = group_key(r)
        groups[group].append(r)
        rows.append(
            {
                **attempt_summary(r, advantages),
                "task": r.task_id,
                "group": group,
                "desktop": r.desktop,
                "page": f"rollouts/{safe_name(r.rollout_id)}.html",
                "group_page": f"groups/{safe_name(group)}.html",
            }
        )
    return rows, groups


def _run_facts(meta: dict[str, Any], run_dir: Path, records: list[Record], n_groups: int):
    final = [r for r in records if r.final]
    rate = sum(1 for r in final if (r.reward or 0) > 0) / len(final) if final else None
    policy = meta.get("policy") or {}
    return {
        "version": policy.get("version") or "?",
        "model": policy.get("model") or "?",
        "task_set": meta.get("task_set") or "?",
        "records": len(records),
        "groups": n_groups,
        "success_rate": "n/a" if rate is None else f"{100 * rate:.0f}%",
        "run_dir": str(run_dir),
        "harness": (meta.get("knobs") or {}).get("harness"),
    }


def _step_view(step, images: _Images, page_dir: Path, harness: str | None) -> dict[str, Any]:
    resp = step.response
    model = step.model
    image_size = None
    href = None
    if step.observation:
        image_size = png_size(images.path(step.observation))
        href = images.href(step.observation, page_dir)
    screen = screen_size(image_size, harness) if image_size else (1280, 720)
    marks = marks_for(step.actions)
    logprobs = resp.logprobs or []
    actions = []
    for a in step.actions:
        what = a.action
        if a.text is not None:
            what += f" {short(a.text, 80)!r}"
        if a.keys:
            what += " " + "+".join(a.keys)
        if a.pixels is not None:
            what += f" {a.pixels}"
        if a.status:
            what += f" {a.status}"
        if a.clamped:
            what += " (clamped)"
        if a.not_typed:
            what += f" (NOT TYPED: {short(a.not_typed, 40)!r})"
        actions.append(
            {
                "what": what,
                "screen": f"{a.screen[0]:g}, {a.screen[1]:g}" if a.screen else "",
                "act_s": a.act_s,
                "wait_s": a.wait_s,
                "ready_s": a.ready_s,
            }
        )
    return {
        "step": step.step,
        "image": href,
        "image_size": image_size or screen,
        "screen": screen,
        "unit": round(screen[0] / 1280, 3),
        "marks": [m for m in marks if m.kind != "label" and m.x is not None],
        "labels": [m for m in marks if m.kind == "label" or m.x is None],
        "content": resp.content or "",
        "reasoning": resp.reasoning,
        "action_text": step.action_text,
        "parse_error": step.parse_error,
        "actions": actions,
        "model_s": model.seconds,
        "attempts": model.attempts,
        "obs_s": step.obs_s,
        "prompt_tokens": model.prompt_tokens,
        "completion_tokens": model.completion_tokens,
        "cached_tokens": model.cached_tokens,
        "n_ids": len(resp.token_ids or []),
        "n_logprobs": len(logprobs),
        "mean_logprob": (sum(logprobs) / len(logprobs)) if logprobs else None,
        "finish": resp.finish_reason,
    }


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    self_contained: bool = False,
    pages: bool = True,
    thumbnails: bool = True,
) -> Report:
    """Write the HTML report of ``run_dir`` into ``out`` (default ``<run_dir>/report``).

    ``pages=False`` writes only the index (the rollout and group links then dangle until a
    later call writes them); ``thumbnails=False`` shows full screenshots scaled down on the
    group pages. Re-running overwrites the pages and keeps existing thumbnails. Raises
    ``ConfigError`` when ``run_dir`` is not a run directory."""
    started = time.perf_counter()
    run_dir = Path(run_dir).resolve()
    meta = read_meta(run_dir)
    out = Path(out).resolve() if out else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    records = read_typed_records(run_dir)
    advantages = group_advantages(records)
    rows, groups = _index_rows(records, advantages)
    run = _run_facts(meta, run_dir, records, len(groups))
    env = environment()
    tasks = sorted({r.task_id for r in records})
    statuses = [s for s in STATUSES if any(r.status == s for r in records)]
    rows_json = orjson.dumps(rows).decode().replace("</", "<\\/")
    _write(
        out / INDEX,
        env.get_template("index").render(
            run=run, tasks=tasks, statuses=statuses, rows_json=rows_json, page_size=PAGE_SIZE
        ),
    )
    index_s = time.perf_counter() - started
    if pages:
        images = _Images(run_dir, out, self_contained)
        _write_rollout_pages(env, out, run, records, advantages, images, meta, run_dir)
        _write_group_pages(env, out, run, groups, advantages, images, meta, run_dir, thumbnails)
    return Report(
        out=out,
        index=out / INDEX,
        rollouts=len(records),
        groups=len(groups),
        index_s=index_s,
        total_s=time.perf_counter() - started,
    )


def _write_rollout_pages(env, out, run, records, advantages, images, meta, run_dir) -> None:
    page_dir = out / "rollouts"
    page_dir.mkdir(exist_ok=True)
    template = env.get_template("rollout")
    info = _instructions(meta, run_dir, records)
    for r in records:
        instruction, evaluator = info.get(r.task_id, (None, None))
        steps = [_step_view(s, images, page_dir, run["harness"]) for s in r.steps]
        tokens = {
            "prompt": sum(s["prompt_tokens"] or 0 for s in steps),
            "cached": sum(s["cached_tokens"] or 0 for s in steps),
            "completion": sum(s["completion_tokens"] or 0 for s in steps),
            "ids": sum(s["n_ids"] for s in steps),
            "logprobs": sum(s["n_logprobs"] for s in steps),
        }
        _write(
            page_dir / f"{safe_name(r.rollout_id)}.html",
            template.render(
                run=run,
                r=r,
                advantage=advantages.get(r.rollout_id),
                instruction=instruction,
                evaluator=evaluator,
                steps=steps,
                tokens=tokens,
                phases=[(p, r.timing.phase(p)) for p in TIME_PHASES],
                index=f"../{INDEX}",
                group_page=f"../groups/{safe_name(group_key(r))}.html",
                grader_log=Path(os.path.relpath(run_dir / r.grader_log, page_dir)).as_posix()
                if r.grader_log
                else None,
            ),
        )


def _write_group_pages(
    env, out, run, groups, advantages, images: _Images, meta, run_dir, thumbnails: bool
) -> None:
    page_dir = out / "groups"
    page_dir.mkdir(exist_ok=True)
    template = env.get_template("group")
    info = _instructions(meta, run_dir, [members[0] for members in groups.values()])
    wanted: set[str] = set()
    for members in groups.values():
        for r in members:
            shots = [s.observation for s in r.steps if s.observation]
            if shots:
                wanted.update({shots[0], shots[-1]})
    made: dict[str, bool] = {}
    if thumbnails and wanted:
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            for sha, path in zip(wanted, pool.map(images.thumb, wanted), strict=True):
                made[sha] = path is not None

    def href(sha: str | None) -> str | None:
        """A group page's URL for a screenshot: its thumbnail, else the screenshot."""
        if not sha:
            return None
        if made.get(sha):
            return f"../thumbs/{sha}.jpg"
        return images.href(sha, page_dir)

    for group, members in groups.items():
        attempts = []
        for r in sorted(members, key=lambda r: (r.attempt, r.execution)):
            shots = [s for s in r.steps if s.observation]
            last = r.steps[-1] if r.steps else None
            attempts.append(
                {
                    **attempt_summary(r, advantages),
                    "first": href(shots[0].observation) if shots else None,
                    "last": href(shots[-1].observation) if shots else None,
                    "last_step": shots[-1].step if shots else 0,
                    "last_action": (last.action_text or last.parse_error) if last else None,
                    "page": f"../rollouts/{safe_name(r.rollout_id)}.html",
                }
            )
        final = [a["reward"] or 0.0 for a in attempts if a["status"] in ("ok", "truncated")]
        mean = sum(final) / len(final) if final else None
        instruction = info.get(members[0].task_id, (None, None))[0]
        _write(
            page_dir / f"{safe_name(group)}.html",
            template.render(
                run=run,
                group=group,
                task=members[0].task_id,
                instruction=instruction,
                attempts=attempts,
                mean=mean,
                flat=len(final) > 1 and max(final) == min(final),
                index=f"../{INDEX}",
            ),
        )


def best_and_worst(records: Iterable[Record]) -> tuple[Record | None, Record | None]:
    """The best and the worst graded execution (``ok``/``truncated``): highest reward (fewest
    steps on a tie) and lowest reward (most steps on a tie); ``None`` when none was graded."""
    final = [r for r in records if r.final]
    if not final:
        return None, None
    best = max(final, key=lambda r: (r.reward or 0.0, -(r.n_steps or 0)))
    worst = min(final, key=lambda r: (r.reward or 0.0, -(r.n_steps or 0)))
    return best, worst
