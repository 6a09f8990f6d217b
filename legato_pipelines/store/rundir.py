"""The run directory, format ``legato.rollout/v0`` (docs/architecture.md §7).

Layout::

    run.json              what this run is: format, policy {model, version}, task_set, knobs,
                          sampling {temperature, top_p, max_tokens, seed, logprobs_mode}
    rollouts.jsonl        one record per execution, appended and flushed one at a time
    messages/<sha>.json   each prompt message once (canonical JSON; images as legato-image:// refs)
    images/<sha>.png      each screenshot once
    grader-logs/<rollout_id>.log  what a grader process (OSWorld's code) wrote for that
                          execution (the record's ``grader_log`` names it)
    summary.json          the profile, rewritten at the end of a batch

A step's ``request`` is the list of its messages' hashes, so storage grows with the number of
steps, not with its square, and :func:`load_request` rebuilds the exact prompt.

A crash can leave a torn last line in ``rollouts.jsonl``: :func:`read_records` drops it, and
:class:`RunWriter` truncates it before appending.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..errors import ConfigError, ResumeError
from ..images import IMAGE_REF_PREFIX, Screenshot
from ..model_files import IDENTITY_KEYS
from ..record import FORMAT as FORMAT  # the format's home is legato_pipelines.record
from ..record import Record, is_final

RECORDS = "rollouts.jsonl"
GRADER_LOGS = "grader-logs"
RUN_META = "run.json"
SUMMARY = "summary.json"
LOCK = ".lock"
_RECORD_KEYS = frozenset(
    {"rollout_id", "task_id", "attempt", "status", "timing", "started_at", "ended_at"}
)


def message_sha(message: Mapping[str, Any]) -> tuple[str, bytes]:
    """(hex SHA-256, canonical JSON bytes) of one message."""
    data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest(), data


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


SAMPLING_FLAGS = {
    "temperature": "--temperature",
    "top_p": "--top-p",
    "max_tokens": "--max-tokens",
    "seed": "--sampling-seed",
    "logprobs_mode": "--logprobs-mode",
}
"""``legato collect`` flag of each ``run.json`` ``sampling`` setting (the resume check's fix)."""
RESUME_FLAGS = {"grader": "--desktop-option grader="}
"""The fix named for a resume knob that is not ``--<knob>`` (default: the knob's own flag)."""


class RunWriter:
    """Appends records and stores messages/images of one run directory.

    One instance per batch, used from one event loop. ``open`` checks (or writes) ``run.json``
    and raises :class:`ResumeError` when the directory holds a run of another policy version
    or task set, or whose ``knobs`` differ in one of ``resume_knobs`` (the engine's
    :data:`~legato_pipelines.rollout.engine.RESUME_KNOBS`: settings that change what a record
    means).
    """

    def __init__(self, root: str | Path, *, resume_knobs: Sequence[str] = ()):
        self.root = Path(root)
        self.resume_knobs = tuple(resume_knobs)
        self._messages_dir = self.root / "messages"
        self._images_dir = self.root / "images"
        self._seen_messages: set[str] = set()
        self._seen_images: set[str] = set()
        self._fh = None
        self._lock = None

    def check(self, meta: dict[str, Any]) -> None:
        """Refuse, before anything is created or started, to resume into a directory that is
        not a run directory (a file, or a non-empty directory without ``run.json``: its files
        would be overwritten), or holds a run of another policy (version or model), task set,
        group or oversample, or of another load mode or checkpoint folder, or of a checkpoint
        whose fingerprint has changed since, or whose weights changed under it (``run.json``'s
        ``checkpoint`` entry, ``after.changed``). A run directory without records (a batch
        stopped before its first attempt ended, e.g. at the policy check) is no run to resume:
        any settings may start there anew. Raises :class:`ResumeError` /
        :class:`ConfigError`."""
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(
                f"out: {self.root} is a file, not a directory (fix: --out a new or existing run directory)"
            )
        meta_path = self.root / RUN_META
        if not meta_path.exists():
            if self.root.is_dir() and (self.root / RECORDS).exists():
                raise ResumeError(
                    f"out: {self.root} has records but no {RUN_META} (fix: choose another --out)"
                )
            foreign = self._foreign() if self.root.is_dir() else []
            if foreign:
                shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
                raise ResumeError(
                    f"out: {self.root} is not empty ({shown}) and is not a run directory (no "
                    f"{RUN_META}); a collection writes its own files there (summary.json, "
                    "rollouts.jsonl...) and would overwrite yours (fix: --out a new or empty "
                    "directory, or the --out of an earlier collect to resume it)"
                )
            return
        if not self._has_records():
            return  # a run that collected nothing (e.g. stopped at its preflight): start anew
        old = orjson.loads(meta_path.read_bytes())
        self._check_checkpoint(old, meta)
        _check_model_files(old, meta)
        old_knobs, knobs = old.get("knobs", {}), meta.get("knobs", {})
        checks = [
            (
                "policy version",
                old.get("policy", {}).get("version"),
                meta["policy"]["version"],
                "--version",
            ),
            ("model", old.get("policy", {}).get("model"), meta["policy"]["model"], "--model"),
            (
                "task set",
                old.get("task_set"),
                meta["task_set"],
                f"the task list {old.get('tasks_path')!r}",
            ),
        ]
        checks += [
            (k, old_knobs.get(k), knobs.get(k), RESUME_FLAGS.get(k, f"--{k.replace('_', '-')}"))
            for k in self.resume_knobs
        ]
        # sampling settings are part of the run's identity (a run.json from before they were
        # recorded has none: nothing to compare)
        old_sampling, sampling = old.get("sampling"), meta.get("sampling") or {}
        if isinstance(old_sampling, dict):
            for k, a in old_sampling.items():
                b = sampling.get(k)
                if a != b and not (k == "logprobs_mode" and (a is None or b is None)):
                    raise ResumeError(
                        f"out: {self.root} holds a run sampled with {k} {a!r}, not {b!r}; "
                        "sampling settings are part of a run's identity (fix: "
                        f"{SAMPLING_FLAGS.get(k, k)} {a!r}, or another --out)"
                    )
        for label, a, b, flag in checks:
            if a is not None and a != b:
                raise ResumeError(
                    f"out: {self.root} holds a run of {label} {a!r}, not {b!r}; a run resumes only with the "
                    f"same policy version, model, task list and collection settings (fix: {flag + str(a) if flag.endswith('=') else f'{flag} {a!r}'}, or another --out)"
                )

    def _foreign(self) -> list[str]:
        """Names in the directory (no ``run.json`` yet) that a run did not write: all but the
        lock and empty ``messages/`` / ``images/`` folders (what a collection that stopped
        before writing ``run.json`` leaves), sorted."""
        own = {LOCK: False, "messages": True, "images": True, GRADER_LOGS: True}  # folder, empty
        names = []
        for entry in self.root.iterdir():
            folder = own.get(entry.name)
            if folder is None or (folder and (not entry.is_dir() or any(entry.iterdir()))):
                names.append(entry.name)
        return sorted(names)

    def _check_checkpoint(self, old: dict[str, Any], meta: dict[str, Any]) -> None:
        """Refuse a resume whose load mode, checkpoint folder or folder fingerprint is not the
        one ``run.json`` records: the records already there came from those weights. A
        ``run.json`` from before loading existed (no ``checkpoint`` entry) resumes with load
        ``none`` (nothing was proven then, nothing is now)."""
        from ..policy.checkpoint_files import same_fingerprint

        was, now = old.get("checkpoint"), meta.get("checkpoint") or {}
        mode = now.get("load", "none")
        if was is None:
            if mode == "none":
                return
            was = {}
        changed = (was.get("after") or {}).get("changed") if isinstance(was, dict) else None
        if changed:
            raise ResumeError(
                f"out: {self.root} holds a run whose weights changed under it: after collecting, "
                f"the server served other weights ({changed[:300]}); its records may mix "
                "weights and it is not resumed (fix: collect the version into a fresh --out)"
            )
        old_mode = was.get("load", "none")
        if old_mode != mode:
            raise ResumeError(
                f"out: {self.root} holds a run collected with load {old_mode!r}, not {mode!r}: "
                "its records and the new ones would come from differently proven weights "
                f"(fix: --load {old_mode}, or another --out)"
            )
        old_path, path = was.get("path"), now.get("path")
        if _norm(old_path) != _norm(path):
            raise ResumeError(
                f"out: {self.root} holds a run collected from checkpoint {old_path or '(none)'}, "
                f"not {path or '(none)'} (fix: --checkpoint {old_path or '(none: drop it)'}, or "
                "another --out)"
            )
        if was.get("fingerprint") is not None or now.get("fingerprint") is not None:
            if not same_fingerprint(was, now):
                raise ResumeError(
                    f"out: {self.root} holds a run collected from checkpoint {old_path} with "
                    f"fingerprint {was.get('fingerprint')}, but {path} now has fingerprint "
                    f"{now.get('fingerprint')}: the checkpoint folder changed, so these weights "
                    "are not the ones the run's records came from (fix: restore the folder, or "
                    "collect the new weights as another --version into another --out)"
                )

    def update_meta(self, key: str, value: Any) -> None:
        """Set ``run.json``'s ``key`` entry to ``value`` (atomically; the run must exist)."""
        path = self.root / RUN_META
        meta = orjson.loads(path.read_bytes())
        meta[key] = value
        atomic_write(path, orjson.dumps(meta, option=orjson.OPT_INDENT_2))

    def open(self, meta: dict[str, Any]) -> list[dict[str, Any]]:
        """Create or resume the directory and take its lock; return the records already there.

        Only one collection may write a run directory at a time: a second one raises
        :class:`ResumeError` at once (``fcntl`` lock on ``<out>/.lock``, released on close or
        when the process dies). Raises what :meth:`check` raises.
        """
        self.check(meta)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root / LOCK, "a+b")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().decode(errors="replace").strip() or "?"
            self._lock.close()
            self._lock = None
            raise ResumeError(
                f"out: {self.root} is in use by another collection (pid {holder}); "
                "one collection writes a run directory at a time (fix: wait for it, or another --out)"
            ) from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()).encode())
        self._lock.flush()
        self._messages_dir.mkdir(exist_ok=True)
        self._images_dir.mkdir(exist_ok=True)
        meta_path = self.root / RUN_META
        if not meta_path.exists() or not self._has_records():
            atomic_write(meta_path, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
            (self.root / SUMMARY).unlink(missing_ok=True)  # a session that collected nothing
        records = read_records(self.root, repair=True)
        self._seen_messages = {p.stem for p in self._messages_dir.glob("*.json")}
        self._seen_images = {p.stem for p in self._images_dir.glob("*.png")}
        self._fh = open(self.root / RECORDS, "ab")
        return records

    def _has_records(self) -> bool:
        """Whether ``rollouts.jsonl`` holds anything (a run's ``run.json`` is written before
        its first record: without records there is nothing to resume)."""
        try:
            return (self.root / RECORDS).stat().st_size > 0
        except FileNotFoundError:
            return False

    def previous_wall_s(self) -> float:
        """Wall seconds of the earlier sessions of this run (from ``summary.json``), so a
        resumed batch reports rollouts per hour over all of its sessions."""
        path = self.root / SUMMARY
        if not path.exists():
            return 0.0
        try:
            return float(orjson.loads(path.read_bytes()).get("wall_s") or 0.0)
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return 0.0

    def store_image(self, shot: Screenshot) -> str:
        """Write the screenshot once (by content hash); return its sha."""
        sha = shot.sha
        if sha not in self._seen_images:
            _write_new(self._images_dir / f"{sha}.png", shot.png)
            self._seen_images.add(sha)
        return sha

    def store_message(self, message: Mapping[str, Any]) -> str:
        """Write the message once (canonical JSON, by content hash); return its sha."""
        sha, data = message_sha(message)
        if sha not in self._seen_messages:
            _write_new(self._messages_dir / f"{sha}.json", data)
            self._seen_messages.add(sha)
        return sha

    def store_grader_log(self, rollout_id: str, data: bytes) -> str:
        """Write what the grader logged for execution ``rollout_id`` to
        ``grader-logs/<rollout_id>.log`` (atomically; one file per execution); return that
        path relative to the run directory, for the record's ``grader_log``."""
        name = f"{GRADER_LOGS}/{rollout_id}.log"
        (self.root / GRADER_LOGS).mkdir(exist_ok=True)
        atomic_write(self.root / name, data)
        return name

    def append(self, record: Record | Mapping[str, Any]) -> None:
        """Append one record (typed, or its JSON dict) as a JSON line and flush it (a kill
        loses no finished record)."""
        if isinstance(record, Record):
            record = record.to_json_dict()
        self._fh.write(orjson.dumps(record) + b"\n")
        self._fh.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write(self.root / SUMMARY, orjson.dumps(summary, option=orjson.OPT_INDENT_2))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def _check_model_files(old: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    """Refuse to resume a run whose server now tokenizes with other files than the ones its
    rows name (``run.json``'s ``model_files``, kept from the first session: the new rows
    would carry the old hashes). Only hashes both sessions know are compared."""
    before, now = old.get("model_files") or {}, meta.get("model_files") or {}
    for key in IDENTITY_KEYS:
        if before.get(key) and now.get(key) and before[key] != now[key]:
            raise ResumeError(
                f"out: the run was collected with {key} {before[key][:12]}... "
                f"({before.get('root')!r}) but the server now uses {now[key][:12]}... "
                f"({now.get('root')!r}); its rows would name files that did not make their "
                "ids (fix: another --out, or serve the run's model folder again)"
            )


def _write_new(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _norm(path: str | None) -> str | None:
    return os.path.normpath(path) if path else None


def read_meta(run_dir: str | Path) -> dict[str, Any]:
    """``run.json`` of a run directory; raises ``ConfigError`` when it is not one."""
    path = Path(run_dir) / RUN_META
    if not path.is_file():
        raise ConfigError(
            f"{run_dir}: not a legato run directory (no {RUN_META}); pass the --out of a collect"
        )
    return orjson.loads(path.read_bytes())


def read_records(run_dir: str | Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """Every record of ``rollouts.jsonl`` in order.

    A torn last line (a crash mid-write) is dropped; with ``repair`` it is also cut from the
    file so appends continue cleanly. A bad line anywhere else is corruption, not a torn
    write: :class:`ConfigError` names the line rather than silently dropping what follows.
    """
    path = Path(run_dir) / RECORDS
    if not path.exists():
        return []
    data = path.read_bytes()
    records: list[dict[str, Any]] = []
    end = 0
    lines = data.splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        try:
            if not line.endswith(b"\n"):
                raise orjson.JSONDecodeError("no newline", "", 0)
            record = orjson.loads(line)
            if not isinstance(record, dict) or not _RECORD_KEYS <= record.keys():
                raise ConfigError(
                    f"{path}: line {number} is not a rollout record; fix: restore the run's own "
                    "rollouts.jsonl (was something else written over it?)"
                )
            records.append(record)
        except orjson.JSONDecodeError:
            if number == len(lines):
                break  # torn last line
            raise ConfigError(
                f"{path}: line {number} of {len(lines)} is not a JSON record (corruption, not a torn "
                "last line); fix: repair or remove that line, nothing after it was read"
            ) from None
        end += len(line)
    if repair and end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
    return records


def read_typed_records(run_dir: str | Path) -> list[Record]:
    """:func:`read_records`, each record typed (:class:`~legato_pipelines.record.Record`)."""
    return [Record.from_json_dict(r) for r in read_records(run_dir)]


def iter_final(records: Iterable[Any]) -> Iterable[Any]:
    """Records (typed or JSON dicts) that count for training: status ``ok`` or ``truncated``."""
    return (r for r in records if is_final(r.status if isinstance(r, Record) else r["status"]))


def load_messages(
    run_dir: str | Path, shas: list[str], *, inline_images: bool = True
) -> list[dict[str, Any]]:
    """The messages with these hashes, images inlined as the data URLs that went over the wire
    (``inline_images``) or left as ``legato-image://<sha>`` refs."""
    root = Path(run_dir)
    out = []
    cache: dict[str, bytes] = {}
    for sha in shas:
        data = (root / "messages" / f"{sha}.json").read_bytes()
        if inline_images and IMAGE_REF_PREFIX.encode() in data:
            data = _inline(root, data, cache)
        out.append(orjson.loads(data))
    return out


def _inline(root: Path, data: bytes, cache: dict[str, bytes]) -> bytes:
    prefix = IMAGE_REF_PREFIX.encode()
    parts = data.split(prefix)
    pieces = [parts[0]]
    for part in parts[1:]:
        sha = part[:64].decode()
        if sha not in cache:
            cache[sha] = Screenshot((root / "images" / f"{sha}.png").read_bytes()).data_url
        pieces.append(cache[sha])
        pieces.append(part[64:])
    return b"".join(pieces)


def load_request(run_dir: str | Path, rollout_id: str, step: int) -> list[dict[str, Any]]:
    """The exact ``messages`` list sent for ``step`` (counted from 0) of ``rollout_id``, images
    inlined as the data URLs that went over the wire.

    Raises ``KeyError`` when the rollout or step does not exist.
    """
    for record in read_records(run_dir):
        if record["rollout_id"] == rollout_id:
            steps = record.get("steps") or []
            if not 0 <= step < len(steps):
                raise KeyError(
                    f"rollout {rollout_id} has {len(steps)} steps; step {step} does not exist (steps count from 0)"
                )
            return load_messages(run_dir, steps[step]["request"])
    raise KeyError(f"no rollout {rollout_id!r} in {run_dir}")


def now() -> float:
    return time.time()
