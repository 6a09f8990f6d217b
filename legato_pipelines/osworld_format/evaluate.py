"""Grade an attempt with a task's OSWorld evaluator: postconfig, getters, metrics, conjunction.

Semantics of OSWorld's ``DesktopEnv.evaluate`` (docs/osworld.md §1):

1. run ``postconfig`` (setup steps, e.g. save the document, kill the app);
2. ``func == "infeasible"``: 1 iff the last action was FAIL; otherwise a last-action FAIL gives 0;
3. one metric: ``metric(result, expected, **options)`` (``metric(result, **options)`` without an
   ``expected``); a ``FileNotFoundError`` from the result getter, or a ``None`` result, gives 0;
4. ``func`` a list (``result`` / ``expected`` / ``options`` parallel lists): ``conj == "and"``
   (default) stops at the first 0, else the mean; ``"or"`` stops at the first 1, else the max.

An evaluator that raises scores 0 with the reason in ``Evaluation.error`` (OSWorld's run loop
records the exception). Facts about the compared files that explain a grade without changing
it (an xlsx whose formulas have no cached values: :mod:`.file_notes`) are
``Evaluation.notes``. Unknown getters/metrics score 0 with ``"... not supported locally"``
and are reported by :func:`~legato_pipelines.osworld_format.classify_task` ahead of time.
Transport failures of the desktop (``DesktopError`` kinds transport/timeout/crash/vm) propagate,
so the engine recovers the desktop instead of grading a dead one.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import DesktopError
from ..scratch import scratch_dir
from ..tasks import Evaluation, Task
from .controller import DesktopController
from .file_notes import file_notes
from .getters import GETTERS, EvalContext
from .metrics import METRICS, TABLE_RULE_TYPES
from .setup import run_setup
from .sources import cache_dir_path
from .unsupported import UnsupportedStep

DEAD_DESKTOP_KINDS = frozenset({"transport", "timeout", "crash", "vm"})


def _as_list(value: Any, n: int, field: str) -> list[Any]:
    # OSWorld iterates result/expected/options in step with a list ``func``: a single object
    # there is not shared across the metrics, it breaks them (DesktopEnv iterates its keys).
    if isinstance(value, list):
        return list(value)
    raise ValueError(
        f"evaluator: func is a list of {n} metrics, so {field} must be a list of {n} entries "
        f"parallel to it (got one object; fix: wrap it in [...] and give one per metric)"
    )


def evaluator_parts(evaluator: dict[str, Any]) -> list[tuple[str, dict | None, dict | None, dict]]:
    """The evaluator as ``[(metric name, result config, expected config, options), ...]``.

    A single metric gives one entry. Missing ``result``/``expected`` entries are ``None``,
    missing options ``{}`` (OSWorld's rules for parallel lists).
    """
    func = evaluator["func"]
    if isinstance(func, list):
        n = len(func)
        results = _as_list(evaluator.get("result") or [None] * n, n, "result")
        expecteds = _as_list(evaluator.get("expected") or [None] * n, n, "expected")
        options = _as_list(evaluator.get("options") or [{}] * n, n, "options")
        if not (len(results) == len(expecteds) == len(options) == n):
            raise ValueError(
                f"evaluator: func has {n} metrics but result/expected/options have "
                f"{len(results)}/{len(expecteds)}/{len(options)} entries (they must be parallel lists)"
            )
        return [
            (f, r or None, e or None, o or {})
            for f, r, e, o in zip(func, results, expecteds, options, strict=True)
        ]
    return [
        (
            func,
            evaluator.get("result") or None,
            evaluator.get("expected") or None,
            evaluator.get("options") or {},
        )
    ]


def evaluator_unsupported(evaluator: dict[str, Any]) -> list[str]:
    """What of this evaluator has no local implementation, e.g. ``["metric compare_pptx_files"]``.

    Lists metrics, getter types and ``compare_table`` rule types, each once, in order seen.
    ``infeasible`` needs nothing. Empty list: the evaluator runs locally.
    """
    missing: list[str] = []
    if not evaluator or "func" not in evaluator:
        return ["evaluator missing"]
    if evaluator["func"] == "infeasible":
        return []
    try:
        parts = evaluator_parts(evaluator)
    except ValueError as exc:
        return [str(exc)]
    for name, result, expected, options in parts:
        if name not in METRICS:
            missing.append(f"metric {name}")
        for getter in (result, expected):
            if getter is not None and getter.get("type") not in GETTERS:
                missing.append(f"getter {getter.get('type')}")
        if name == "compare_table":
            for rule in options.get("rules", []):
                if rule.get("type") not in TABLE_RULE_TYPES:
                    missing.append(f"compare_table rule {rule.get('type')}")
                elif rule["type"] == "check_cell" and set(rule.get("props", {})) - {"value"}:
                    missing.append(
                        "compare_table check_cell props "
                        + ",".join(sorted(set(rule["props"]) - {"value"}))
                    )
    return list(dict.fromkeys(missing))


async def evaluate_task(
    task: Task,
    controller: DesktopController,
    *,
    last_action_fail: bool = False,
    cache_dir: Path | str | None = None,
    work_dir: Path | None = None,
    screen_size: tuple[int, int] = (1280, 720),
    client_password: str = "password",
) -> Evaluation:
    """Grade the desktop's current state against ``task``'s evaluator; reward in [0, 1].

    ``last_action_fail``: the agent's last action was FAIL (OSWorld ``infeasible``).
    ``cache_dir``: read-only file cache for downloads / ``cloud_file`` / ``cache_file`` (see
    :mod:`.sources`): a ``Path`` or a ``str``, ``~`` expanded (:func:`.sources.cache_dir_path`,
    which raises ``ConfigError`` for anything else).
    ``work_dir``: where fetched files and postconfig captures go (default: a temporary directory
    removed afterwards; pass the one given to ``run_setup`` to read setup captures).
    ``screen_size`` (pixels) and ``client_password`` fill postconfig placeholders.

    Returns ``Evaluation(reward, error, notes, postconfig_failures)``; ``error`` is set when
    the evaluator could not run; ``notes`` (``"<kind>: <text>"``) are facts about the compared
    files (:func:`.file_notes.file_notes`), never a change of the reward;
    ``postconfig_failures`` the postconfig's steps OSWorld carries on after
    (:func:`.setup.run_setup` with ``window_misses``).
    Raises ``DesktopError`` only when the desktop itself failed (transport, timeout, crash).
    """
    evaluator = task.evaluator
    cache_dir = cache_dir_path(cache_dir)  # a str option must not reach the getters' "/"
    unsupported = evaluator_unsupported(evaluator)
    if unsupported:
        return Evaluation(
            0.0, error="; ".join(f"{part} not supported locally" for part in unsupported)
        )
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        return await _evaluate(
            task,
            controller,
            last_action_fail,
            cache_dir,
            Path(work_dir),
            screen_size,
            client_password,
        )
    tmp = scratch_dir(f"legato-eval-{task.task_id[:8]}-")
    try:
        return await _evaluate(
            task, controller, last_action_fail, cache_dir, Path(tmp), screen_size, client_password
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _evaluate(
    task: Task,
    controller: DesktopController,
    last_action_fail: bool,
    cache_dir: Path | None,
    work_dir: Path,
    screen_size: tuple[int, int],
    client_password: str,
) -> Evaluation:
    ctx = EvalContext(
        controller=controller, task_id=task.task_id, work_dir=work_dir, cache_dir=cache_dir
    )
    facts: list[dict[str, Any]] = []  # the postconfig's steps OSWorld carries on after
    evaluation = await _graded(task, ctx, last_action_fail, screen_size, client_password, facts)
    if ctx.notes:  # facts about the compared files: the grade stays OSWorld's
        evaluation = replace(evaluation, notes=tuple(dict.fromkeys(ctx.notes)))
    if facts:
        evaluation = replace(evaluation, postconfig_failures=tuple(facts))
    return evaluation


async def _graded(
    task: Task,
    ctx: EvalContext,
    last_action_fail: bool,
    screen_size: tuple[int, int],
    client_password: str,
    facts: list[dict[str, Any]],
) -> Evaluation:
    evaluator = task.evaluator
    controller, cache_dir, work_dir = ctx.controller, ctx.cache_dir, ctx.work_dir
    try:
        facts += await run_setup(
            task,
            controller,
            steps=list(evaluator.get("postconfig") or []),
            cache_dir=cache_dir,
            work_dir=work_dir,
            screen_size=screen_size,
            client_password=client_password,
            window_misses=True,  # a close/activate that found nothing explains a grade
        )
        if evaluator["func"] == "infeasible":
            return Evaluation(1.0 if last_action_fail else 0.0)
        if last_action_fail:
            return Evaluation(0.0)
        parts = evaluator_parts(evaluator)
        if len(parts) == 1 and not isinstance(evaluator["func"], list):
            score, error = await _score(ctx, *parts[0])
            return Evaluation(score, error)
        conj = evaluator.get("conj", "and")
        if conj not in ("and", "or"):
            raise ValueError(f"evaluator: conj must be 'and' or 'or', got {conj!r}")
        scores: list[float] = []
        errors: list[str] = []
        for part in parts:
            score, error = await _score(ctx, *part)
            if error:
                errors.append(error)
            if conj == "and" and score == 0.0:
                return Evaluation(0.0, "; ".join(errors) or None)
            if conj == "or" and score == 1.0:
                return Evaluation(1.0)
            scores.append(score)
        total = sum(scores) / len(scores) if conj == "and" else max(scores)
        return Evaluation(total, "; ".join(errors) or None)
    except UnsupportedStep as exc:
        return Evaluation(0.0, error=str(exc))
    except DesktopError as exc:
        if exc.kind in DEAD_DESKTOP_KINDS:
            raise
        return Evaluation(0.0, error=f"{exc.kind}: {exc}")
    except Exception as exc:  # OSWorld: an evaluator that raises scores 0, reason recorded
        return Evaluation(0.0, error=f"evaluator raised {type(exc).__name__}: {exc}")


async def _score(
    ctx: EvalContext, name: str, result_cfg: dict | None, expected_cfg: dict | None, options: dict
) -> tuple[float, str | None]:
    """One metric's score and, when it could not be computed, the reason (score 0)."""
    if result_cfg is None:
        return 0.0, f"metric {name}: the evaluator has no result getter"
    try:
        result = await GETTERS[result_cfg["type"]](ctx, result_cfg)
    except FileNotFoundError:
        return 0.0, None  # OSWorld: the agent's file is missing -> 0
    if result is None:
        return 0.0, None
    metric = METRICS[name]
    ctx.notes.extend(await asyncio.to_thread(file_notes, result, "result"))
    if expected_cfg is not None:
        try:
            expected = await GETTERS[expected_cfg["type"]](ctx, expected_cfg)
        except FileNotFoundError as exc:
            return 0.0, f"metric {name}: expected file missing: {exc}"
        ctx.notes.extend(await asyncio.to_thread(file_notes, expected, "expected"))
        score = await asyncio.to_thread(metric, result, expected, **options)
    else:
        score = await asyncio.to_thread(metric, result, **options)
    return float(score), None


async def evaluate_task_within(
    task: Task, controller: DesktopController, *, timeout: float, desktop: str, **kwargs
) -> Evaluation:
    """:func:`evaluate_task` with a deadline of ``timeout`` seconds (the desktop's
    ``eval_timeout``), for backends that grade over the server API (``local``, OSWorld VM
    servers attached by URL). Raises ``DesktopError(kind="evaluator")`` naming ``desktop``
    when the evaluation hangs; ``kwargs`` go to :func:`evaluate_task`."""
    try:
        async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel (3.11)
            return await evaluate_task(task, controller, **kwargs)
    except TimeoutError:
        raise DesktopError(
            f"{desktop}: evaluating task {task.task_id!r} took over {timeout:g} s", kind="evaluator"
        ) from None
