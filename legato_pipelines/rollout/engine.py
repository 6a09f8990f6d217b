"""``collect``: one batch of graded attempts for one policy version (docs/architecture.md §3).

One worker per desktop, each owning its desktop (reset between attempts, recover a failed
desktop before taking new work), all on one event loop; a global cap on in-flight model
requests lives in the policy client. Resuming into the same ``out`` keeps finished groups and
re-runs only what is missing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..desktops import open_desktops
from ..desktops.base import Desktop, DesktopConfig
from ..errors import ConfigError, DesktopError, TaskListError
from ..policy.config import PolicyConfig
from ..store.rundir import FORMAT, RunWriter, read_records
from ..tasks import TaskSet, load_tasks
from . import statuses as st
from .attempt import AttemptContext, run_attempt, settled_record
from .profile import summarize
from .scheduler import Group, Scheduler, group_attempts

log = logging.getLogger("legato_pipelines.collect")

OnRecord = Callable[[dict[str, Any]], None]


def collect(
    tasks: TaskSet | str | Path | list, policy: PolicyConfig, out: str | Path, **kwargs: Any
) -> dict[str, Any]:
    """Collect one batch (blocking). See :func:`collect_async` for the arguments."""
    return asyncio.run(collect_async(tasks, policy, out, **kwargs))


async def collect_async(
    tasks: TaskSet | str | Path | list,
    policy: PolicyConfig,
    out: str | Path,
    *,
    desktops: int = 4,
    desktop: DesktopConfig | None = None,
    group: int = 4,
    oversample: float = 0.0,
    max_steps: int = 15,
    max_inflight: int | None = None,
    step_timeout: float | None = None,
    retries: int | None = None,
    rollout_timeout: float | None = None,
    env_retries: int = 1,
    ready_signal: bool | None = None,
    fixed_wait: float | None = None,
    fast_reset: bool | None = None,
    image_max: int = 20,
    osworld: str | Path | None = None,
    harness: str = "qwen3vl",
    history: str = "window",
    seed: int = 0,
    check_policy: bool = True,
    on_record: OnRecord | None = None,
    desktop_pool: list[Desktop] | None = None,
) -> dict[str, Any]:
    """Collect graded attempts of every task for one policy version into the run directory
    ``out`` and return its summary (also written to ``out/summary.json``).

    Arguments (units): ``group`` attempts per task (one GRPO group); ``oversample`` extra
    attempts per group as a fraction (ceil(group*oversample)); ``max_steps`` policy calls per
    attempt; ``max_inflight`` cap on concurrent model requests (None: one per desktop);
    ``step_timeout`` [s] / ``retries`` per model call (override ``policy``'s); ``rollout_timeout``
    [s] wall-clock cap per attempt (then graded, ``truncated``); ``env_retries`` new executions
    after a desktop failure; ``ready_signal`` / ``fixed_wait`` [s] / ``fast_reset`` override
    ``desktop``'s; ``image_max`` screenshots kept in the prompt; ``harness`` ``qwen3vl`` |
    ``qwen25vl``; ``history`` ``window`` | ``hysteresis``; ``seed`` seeds attempt seeds (the fake
    backend's rewards). ``desktop_pool``: already-open desktops to use instead of starting them.

    Raises ``ConfigError`` (bad knobs, bad task list, resume into another run),
    ``PolicyConfigError`` (wrong URL/model/option: before any desktop starts, or at the first
    call) and ``DesktopError`` when no desktop can be started. Records already written are kept.
    """
    from ..harness import Harness
    from ..policy.client import PolicyClient

    check_knobs(
        group=group,
        oversample=oversample,
        max_steps=max_steps,
        max_inflight=max_inflight,
        rollout_timeout=rollout_timeout,
        env_retries=env_retries,
        image_max=image_max,
        desktops=desktops,
    )
    task_set = tasks if isinstance(tasks, TaskSet) else load_tasks(tasks, osworld=osworld)
    policy = policy.model_copy(
        update={
            k: v for k, v in (("step_timeout", step_timeout), ("retries", retries)) if v is not None
        }
    )
    desktop = (desktop or DesktopConfig()).model_copy()
    updates = {
        k: v
        for k, v in (
            ("ready_signal", ready_signal),
            ("fixed_wait", fixed_wait),
            ("fast_reset", fast_reset),
        )
        if v is not None
    }
    if updates:
        desktop = DesktopConfig.model_validate(desktop.model_dump() | updates)
    knobs = {
        "group": group,
        "oversample": oversample,
        "max_steps": max_steps,
        "max_inflight": max_inflight,
        "step_timeout": policy.step_timeout,
        "retries": policy.retries,
        "rollout_timeout": rollout_timeout,
        "env_retries": env_retries,
        "ready_signal": desktop.ready_signal,
        "fixed_wait": desktop.fixed_wait,
        "fast_reset": desktop.fast_reset,
        "image_max": image_max,
        "harness": harness,
        "history": history,
        "backend": desktop.backend,
        "desktops": len(desktop_pool) if desktop_pool else desktops,
        "seed": seed,
    }
    harness_obj = Harness(variant=harness, history=history, image_max=image_max)
    policy_info = {"model": policy.model, "version": policy.version}
    meta = {
        "format": FORMAT,
        "policy": policy_info,
        "task_set": task_set.task_set,
        "tasks_path": task_set.path,
        "n_tasks": len(task_set),
        "knobs": knobs,
        "created_at": time.time(),
    }

    _preflight(task_set, desktop)
    writer = RunWriter(out)
    writer.check(meta)  # resuming into another run fails here, before anything starts
    per_group = group_attempts(group, oversample)
    peek = Scheduler()
    _plan(
        peek,
        task_set,
        read_records(out) if Path(out).is_dir() else [],
        group=group,
        per_group=per_group,
        seed=seed,
    )
    owned = desktop_pool is None
    pool: list[Desktop] = []
    async with PolicyClient(
        policy, max_inflight=max_inflight or len(desktop_pool or []) or desktops
    ) as client:
        if peek.pending() and check_policy:
            await client.check()  # a wrong URL or model fails here, in seconds, writing nothing
        previous = writer.open(meta)  # takes the run directory's lock; cuts a torn last line
        started, prior_wall_s = time.time(), writer.previous_wall_s()
        sched = Scheduler()
        _plan(sched, task_set, previous, group=group, per_group=per_group, seed=seed)
        records: list[dict[str, Any]] = list(previous)

        def emit(record: dict[str, Any]) -> None:
            writer.append(record)
            records.append(record)
            if on_record is not None:
                on_record(record)

        try:
            ctx = AttemptContext(
                policy=client,
                harness=harness_obj,
                writer=writer,
                policy_info=policy_info,
                task_set=task_set.task_set,
                max_steps=max_steps,
                rollout_timeout=rollout_timeout,
                eval_timeout=desktop.eval_timeout,
                env_retries=env_retries,
            )
            if sched.pending():
                pool = (
                    desktop_pool
                    if desktop_pool is not None
                    else await open_desktops(desktop, min(desktops, sched.pending()))
                )
                await _run_workers(ctx, sched, pool, emit)
        finally:
            if owned:
                await asyncio.gather(*(d.close() for d in pool), return_exceptions=True)
            wall_s = prior_wall_s + (time.time() - started)
            summary = summarize(records, meta, wall_s=wall_s, groups=sched.groups)
            writer.write_summary(summary)
            writer.close()
    return summary


async def _run_workers(ctx: AttemptContext, sched: Scheduler, pool: list[Desktop], emit) -> None:
    """One worker per desktop until the queue is empty; if every desktop is gone, what is
    left in the queue ends as an ``env`` error (nothing is silently dropped)."""
    workers = [
        asyncio.create_task(_worker(ctx, sched, d, emit), name=f"worker-{d.name}") for d in pool
    ]
    try:
        results = await asyncio.gather(*workers, return_exceptions=True)
    finally:
        for w in workers:
            w.cancel()
    for failure in results:
        if isinstance(failure, BaseException) and not isinstance(failure, DesktopError):
            raise failure
    while (ex := sched.next()) is not None:
        record = settled_record(ctx, ex, st.ERROR)
        record["error"] = {
            "kind": "env",
            "type": "no_desktop",
            "message": "no working desktop left",
            "phase": "queue",
        }
        emit(record)


async def _worker(ctx: AttemptContext, sched: Scheduler, desktop: Desktop, emit) -> None:
    """One desktop's loop: take the next execution, run it, record it, recover on failure."""
    broken = False
    while True:
        if broken:
            await desktop.recover()  # DesktopError here retires this worker
            broken = False
        ex = sched.next()
        if ex is None:
            return
        if ex.group.closed:
            emit(settled_record(ctx, ex, st.SKIPPED))
            continue
        record = await run_attempt(ctx, ex, desktop)
        emit(record)
        status = record["status"]
        if status in st.FINAL_FOR_TRAINING:
            for skipped in sched.finish(ex.group):
                emit(settled_record(ctx, skipped, st.SKIPPED))
        elif status == st.RETRIED:
            sched.retry(ex, time.time())
        if record["error"] and record["error"]["kind"] == "env":
            broken = True


def _plan(
    sched: Scheduler,
    task_set: TaskSet,
    previous: list[dict],
    *,
    group: int,
    per_group: int,
    seed: int,
) -> None:
    """Queue what is missing: all of a new batch, or on resume every logical attempt of an
    unfinished group that has no final record (finished groups are kept as they are)."""
    by_attempt: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in previous:
        by_attempt[(r["task_id"], r["attempt"])].append(r)
    now = time.time()
    for index, task in enumerate(task_set.tasks):
        g = Group(index=index, task=task, group_id=f"{task.task_id}", size=group)
        todo, executions = [], {}
        for attempt in range(per_group):
            recs = by_attempt.get((task.task_id, attempt), [])
            g.finished += sum(1 for r in recs if r["status"] in st.FINAL_FOR_TRAINING)
            if not recs or recs[-1]["status"] == st.RETRIED:
                todo.append(attempt)
                executions[attempt] = len(recs)
        g.closed = g.finished >= group
        sched.add_group(g, [] if g.closed else todo, seed=seed, now=now, executions=executions)
        if g.closed:
            continue


def _preflight(task_set: TaskSet, desktop: DesktopConfig) -> None:
    """Refuse tasks that cannot run on the chosen backend (a misspelled metric, a setup step
    missing a parameter, a download that needs the internet...) before any desktop starts,
    rather than grading them 0 one by one. Raises ``TaskListError`` listing the problems."""
    from ..osworld_format import preflight

    problems = preflight(task_set, desktop.backend, cache_dir=desktop.options.get("cache_dir"))
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise TaskListError(
            f"{len(problems)} problem(s) with the task list for backend {desktop.backend!r} "
            f"(`legato tasks check` shows them all):\n  {shown}{more}"
        )


def check_knobs(**k: Any) -> None:
    """Check the collection knobs (``group``, ``oversample``, ``max_steps``, ``max_inflight``,
    ``rollout_timeout``, ``env_retries``, ``image_max``, ``desktops``: the semantics of
    :func:`collect_async`) before anything starts. Raises ``ConfigError`` naming the knob and
    its flag."""

    def bad(name: str, rule: str) -> ConfigError:
        return ConfigError(f"{name}: {rule}, got {k[name]!r} (fix: --{name.replace('_', '-')})")

    if not isinstance(k["group"], int) or k["group"] < 1:
        raise bad("group", "attempts per task must be an integer >= 1")
    if k["oversample"] < 0:
        raise bad("oversample", "must be >= 0 (a fraction of group)")
    if k["max_steps"] < 1:
        raise bad("max_steps", "must be >= 1")
    if k["max_inflight"] is not None and k["max_inflight"] < 1:
        raise bad("max_inflight", "must be >= 1 or unset")
    if k["rollout_timeout"] is not None and k["rollout_timeout"] <= 0:
        raise bad("rollout_timeout", "must be > 0 seconds or unset")
    if k["env_retries"] < 0:
        raise bad("env_retries", "must be >= 0")
    if k["image_max"] < 1:
        raise bad("image_max", "must be >= 1")
    if k["desktops"] < 1:
        raise bad("desktops", "must be >= 1")
