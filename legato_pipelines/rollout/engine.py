"""``collect``: one batch of graded attempts for one policy version (docs/architecture.md §3).

One worker per desktop, each owning its desktop (reset between attempts, recover a failed
desktop before taking new work), all on one event loop; a global cap on in-flight model
requests lives in the policy client. Resuming into the same ``out`` keeps closed groups and
re-runs, in the others, what is missing or ended in error (:func:`_plan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ..desktops import open_desktops, task_defaults, warm_up
from ..desktops.base import Desktop, DesktopConfig
from ..desktops.network import resolve_network
from ..desktops.registry import capabilities, get
from ..errors import DesktopError, LoadError, PolicyConfigError, TaskListError
from ..model_files import served_identity
from ..policy.config import PolicyConfig
from ..policy.loading import (
    LoadSpec,
    adapter_gone,
    load_version,
    plan_load,
    release,
    verify_served,
)
from ..record import (
    ENV,
    ERROR,
    FORMAT,
    RERUN_ON_RESUME,
    RETRIED,
    SKIPPED,
    ErrorInfo,
    PolicyRef,
    Record,
    as_records,
)
from ..store.rundir import RunWriter, read_records
from ..tasks import TaskSet, load_tasks
from .attempt import AttemptContext, run_attempt, settled_record
from .handout import Handout
from .profile import summarize
from .scheduler import Group, Scheduler, group_attempts
from .settings import (
    OVERRIDES_DESKTOP,
    OVERRIDES_POLICY,
    RESUME_SETTINGS,
    CollectSettings,
    attached_servers,
    spare_desktops,
)

RESUME_KNOBS = (*RESUME_SETTINGS, "backend", "grader")
"""``run.json`` knobs a resumed run must share with the run it continues: the resume settings,
the desktop backend and the grader (``osworld``: desktop-env's own setup and evaluators,
``own``: the package's subset; a run's rewards come from one of them)."""

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
    settings: CollectSettings | Mapping[str, Any] | None = None,
    desktop: DesktopConfig | None = None,
    osworld: str | Path | None = None,
    check_policy: bool = True,
    on_record: OnRecord | None = None,
    desktop_pool: list[Desktop] | None = None,
    load: LoadSpec | None = None,
    collected_by: str | None = None,
    **knobs: Any,
) -> dict[str, Any]:
    """Collect graded attempts of every task for one policy version into the run directory
    ``out`` and return its summary (also written to ``out/summary.json``).

    The collection knobs are :class:`~legato_pipelines.rollout.settings.CollectSettings`
    (``settings=``), or its fields as keywords (``group=``, ``max_steps=``...; they override
    ``settings``): ``desktops``, ``group`` attempts per task (one GRPO group); ``oversample``
    extra attempts per group as a fraction (ceil(group*oversample)); ``max_steps`` policy calls
    per attempt; ``max_inflight`` cap on concurrent model requests (None: one per desktop);
    ``step_timeout`` [s] / ``retries`` per model call (override ``policy``'s when set);
    ``rollout_timeout`` [s] wall-clock cap per attempt (then graded, ``truncated``);
    ``env_retries`` new executions after a desktop failure; ``spares`` desktops more than
    ``desktops``, prepared ahead for the next queued attempts (:mod:`.handout`; unset: see
    :func:`~.settings.spare_desktops`); ``ready_signal`` / ``fixed_wait``
    [s] / ``fast_reset`` override ``desktop``'s when set; ``image_max`` screenshots kept in the
    prompt; ``harness`` ``qwen3vl`` | ``qwen25vl``; ``history`` ``window`` | ``hysteresis``;
    ``seed`` seeds attempt seeds (the fake backend's rewards). ``osworld``: an OSWorld checkout
    to resolve the task list; ``desktop_pool``: already-open desktops to use instead of
    starting them.

    ``load``: how the policy version reaches the server
    (:class:`~legato_pipelines.policy.loading.LoadSpec`): before any desktop starts the
    checkpoint is fingerprinted, loaded (``lora``, ``weights``) or verified (``external``), and
    the batch calls the model id that serves it; ``run.json`` gets a ``checkpoint`` entry (mode,
    served model, folder, fingerprint, proof) and every record's ``policy`` the mode, folder and
    fingerprint. A resume whose checkpoint fingerprint differs is refused. ``collected_by``: a
    session id written on every record of this session (the Dagster run id under Dagster).

    Raises ``ConfigError`` (bad knobs, bad task list, resume into another run, a checkpoint
    folder that changed), ``LoadError`` (the checkpoint could not be loaded or is not served:
    before any desktop starts, quoting the server), ``PolicyConfigError`` (wrong URL/model/
    option: before any desktop starts, or at the first call) and ``DesktopError`` when no
    desktop can be started. Records already written are kept.
    """
    from ..harness import Harness
    from ..policy.client import PolicyClient

    settings = _settings(settings, knobs)
    desktops = settings.desktops
    task_set = tasks if isinstance(tasks, TaskSet) else load_tasks(tasks, osworld=osworld)
    policy = policy.model_copy(update=settings.overrides(OVERRIDES_POLICY))
    desktop = (desktop or DesktopConfig()).model_copy()
    defaults: dict = {}
    if desktop_pool is None:  # OSWorld's tasks: the VM's screen and look unless set
        desktop, defaults = task_defaults.for_tasks(desktop, task_set.tasks)
    updates = settings.overrides(OVERRIDES_DESKTOP)
    if updates:
        desktop = DesktopConfig.model_validate(desktop.model_dump() | updates)
    if desktop_pool is None:  # the desktops' network, fixed when they start: per batch
        desktop, network = resolve_network(desktop, task_set.tasks)
    else:
        network = {}
    effective = settings.model_copy(
        update={
            **{name: getattr(policy, name) for name in OVERRIDES_POLICY},
            **{name: getattr(desktop, name) for name in OVERRIDES_DESKTOP},
        }
    )
    if desktop_pool is None:
        spares = spare_desktops(
            settings.spares,
            desktops=desktops,
            backend=desktop.backend,
            attached=attached_servers(desktop.options),
        )
    else:  # already-open desktops: the spares among them only when asked for
        spares = min(settings.spares or 0, len(desktop_pool) - 1)
        desktops = len(desktop_pool) - spares
    effective = effective.model_copy(update={"spares": spares})
    knobs = effective.knobs(backend=desktop.backend, desktops=desktops) | network
    if defaults:
        knobs["osworld_defaults"] = defaults
    group, oversample, seed = settings.group, settings.oversample, settings.seed
    harness_obj = Harness(
        variant=settings.harness, history=settings.history, image_max=settings.image_max
    )
    plan = await plan_load(load, policy) if load is not None else None
    if plan is not None:
        # every request salted by the checkpoint: no prefix-cache hit on other weights' KV
        policy = policy.model_copy(update={"model": plan.model, "cache_salt": plan.cache_salt})
    policy_info = PolicyRef(model=policy.model, version=policy.version)
    if plan is not None:
        policy_info.load = plan.spec.mode
        if plan.checkpoint is not None:
            policy_info.checkpoint = plan.checkpoint
            policy_info.fingerprint = plan.fingerprint["digest"]
        if plan.cache_salt is not None:
            policy_info.cache_salt = plan.cache_salt
    meta = {
        "format": FORMAT,
        "policy": policy_info.to_json_dict(),
        "task_set": task_set.task_set,
        "tasks_path": task_set.path,
        "n_tasks": len(task_set),
        "knobs": knobs,
        "sampling": policy.sampling(),
        "created_at": time.time(),
    }
    if plan is not None:
        meta["checkpoint"] = plan.meta()

    grader = _preflight(task_set, desktop, desktops=desktops + spares)
    if grader is not None:
        meta["knobs"]["grader"] = grader
    writer = RunWriter(out, resume_knobs=RESUME_KNOBS)
    writer.check(meta)  # resuming into another run fails here, before anything starts
    per_group = group_attempts(group, oversample)
    peek = Scheduler()
    _plan(
        peek,
        task_set,
        as_records(read_records(out)) if Path(out).is_dir() else [],
        group=group,
        per_group=per_group,
        seed=seed,
    )
    try:
        owned = desktop_pool is None
        pool: list[Desktop] = []
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(young_gc_threshold())
            if owned and peek.pending():
                # e.g. the local graders' template: its import runs beside the checks below
                evaluators = [ex.group.task.evaluator for ex in peek.queue]
                await stack.enter_async_context(warm_up(desktop, evaluators))
            client = await stack.enter_async_context(
                PolicyClient(
                    policy,
                    max_inflight=settings.max_inflight or desktops,
                )
            )
            if peek.pending() and plan is not None:
                # the version's weights into the server (or verified there), before any desktop
                await load_version(plan)
                meta["checkpoint"] = plan.meta()
            if peek.pending() and check_policy:
                # a wrong URL or model fails here, in seconds, writing nothing
                if plan is None or plan.listed_model == policy.model:
                    await client.check()
                elif plan.listed_model not in await client.list_models():
                    raise PolicyConfigError(
                        f"model {plan.listed_model!r} is not served at {policy.api_base} (fix: --model)"
                    )
                if client.logprobs_mode:  # the server reported it: that is what the logprobs are
                    meta["sampling"] = policy.sampling(client.logprobs_mode)
                    writer.check(meta)
                # the tokenizer, chat template and processor that make the ids (issue 32)
                listed = policy.model if plan is None else plan.listed_model
                meta["model_files"] = served_identity(client.model_entries, listed)
            # takes the run directory's lock; cuts a torn last line
            previous = as_records(writer.open(meta))
            started, prior_wall_s = time.time(), writer.previous_wall_s()
            sched = Scheduler()
            _plan(sched, task_set, previous, group=group, per_group=per_group, seed=seed)
            records: list[Record] = list(previous)

            def emit(record: Record) -> None:
                if collected_by is not None:
                    record.collected_by = collected_by
                line = record.to_json_dict()
                writer.append(line)
                records.append(record)
                if on_record is not None:
                    on_record(line)

            try:
                ctx = AttemptContext(
                    policy=client,
                    harness=harness_obj,
                    writer=writer,
                    policy_info=policy_info,
                    task_set=task_set.task_set,
                    max_steps=settings.max_steps,
                    rollout_timeout=settings.rollout_timeout,
                    eval_timeout=desktop.eval_timeout,
                    env_retries=settings.env_retries,
                )
                if sched.pending():
                    # runners + spares, no more desktops than attempts to run
                    n_open = min(desktops + spares, sched.pending())
                    runners = min(desktops, n_open)
                    late = 0
                    if desktop_pool is not None:
                        pool = desktop_pool
                    else:
                        # the spares start while the runners' first attempts run
                        late = n_open - runners if opens_late(desktop) else 0
                        pool = await open_desktops(desktop, n_open - late)
                    later = (
                        (lambda: open_desktops(desktop, late, first=n_open - late), late)
                        if late
                        else None
                    )
                    try:
                        await _run_workers(ctx, sched, pool, emit, runners=runners, later=later)
                    except PolicyConfigError as exc:
                        gone = (
                            await adapter_gone(plan)
                            if plan is not None and exc.status_code == 404
                            else None
                        )
                        if gone is None:
                            raise
                        raise LoadError(gone) from exc
                    if plan is not None:
                        await _verify_after(plan, writer)
            finally:
                if owned:
                    await asyncio.gather(*(d.close() for d in pool), return_exceptions=True)
                wall_s = prior_wall_s + (time.time() - started)
                summary = summarize(records, meta, wall_s=wall_s, groups=sched.groups)
                writer.write_summary(summary)
                writer.close()
        return summary
    finally:
        release(plan)  # the server's weights lock, adapter leases: the next run may load


GC_YOUNG_THRESHOLD = 10_000
"""Net new container objects between two young garbage collections while a batch runs
(Python's default: 700). Every step leaves ~70 long-lived objects (its record's lists and
models, the prompt's messages, the prompt ids) and a collection costs ~2 us per object it
scans, so with ~1,000 rollouts in flight the default spent a fifth of the collector's CPU in
the collector of cycles (BENCHMARKS.md, issue 18); the run makes almost no cyclic garbage (the
HTTP clients break httpx's response cycle), so collecting less often frees nothing later."""


@contextlib.contextmanager
def young_gc_threshold(threshold: int = GC_YOUNG_THRESHOLD):
    """Raise the young generation's GC threshold to ``threshold`` for the block (never lower
    it, never turn collection on); the thresholds in force before are restored after."""
    before = gc.get_threshold()
    if before[0]:  # 0: automatic collection is off; leave it so
        gc.set_threshold(max(before[0], threshold), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


async def _verify_after(plan, writer: RunWriter) -> None:
    """After collecting: the server still serves what was proven (``run.json``'s
    ``checkpoint.after``); raises ``LoadError`` when it serves other weights now."""
    try:
        after = await verify_served(plan)
    except LoadError as exc:
        writer.update_meta("checkpoint", {**plan.meta(), "after": {"changed": str(exc)}})
        raise
    writer.update_meta("checkpoint", {**plan.meta(), "after": after})


def opens_late(desktop: DesktopConfig) -> bool:
    """Whether a batch on ``desktop`` starts its spares after its runners' desktops, while the
    first attempts run (:meth:`.Handout.join`): the backend's capability ``opens_late``
    (:mod:`..desktops.registry`: desktops started here by the ``local`` and ``fake`` backends,
    not attached by URL, not OSWorld VMs)."""
    return capabilities(desktop.backend, desktop.options).opens_late


async def _run_workers(
    ctx: AttemptContext,
    sched: Scheduler,
    pool: list[Desktop],
    emit,
    runners: int | None = None,
    later: tuple[Callable[[], Awaitable[list[Desktop]]], int] | None = None,
) -> None:
    """``runners`` attempts at once (default: one per desktop) on the desktops of ``pool``,
    the others prepared ahead (:mod:`.handout`), until the queue is empty; if every desktop
    is gone, what is left in the queue ends as an ``env`` error (nothing is silently
    dropped). ``later``: ``(open, n)``, ``n`` more desktops that ``open()`` starts now, while
    the runners go; they join the pool when up and are appended to ``pool`` (the caller
    closes it); a batch that ends first cancels their opening (which stops what it started)."""
    n = max(1, min(runners or len(pool), len(pool)))
    handout = Handout(sched, pool, lambda ex: emit(settled_record(ctx, ex, SKIPPED)), runners=n)
    started = time.perf_counter()  # every runner asks for its first desktop now
    joining = (
        asyncio.create_task(handout.join(later[0](), later[1]), name="spares-join")
        if later
        else None
    )
    workers = [
        asyncio.create_task(_worker(ctx, sched, handout, emit, started), name=f"runner-{i}")
        for i in range(n)
    ]
    try:
        results = await asyncio.gather(*workers, return_exceptions=True)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if joining is not None:
            joining.cancel()
            with contextlib.suppress(BaseException):
                await joining
        await handout.aclose()
        pool.extend(handout.joined)
    for failure in results:
        if isinstance(failure, BaseException) and not isinstance(failure, DesktopError):
            raise failure
    if ctx.abort is not None:
        # the server refused the batch's settings mid-batch: every attempt that ran is
        # recorded; the queued ones stay unrecorded (a resume runs them once fixed)
        raise ctx.abort
    while (ex := sched.next()) is not None:
        record = settled_record(ctx, ex, ERROR)
        record.error = ErrorInfo(
            kind=ENV, type="no_desktop", message="no working desktop left", phase="queue"
        )
        emit(record)


async def _worker(
    ctx: AttemptContext, sched: Scheduler, handout: Handout, emit, asked: float
) -> None:
    """One runner's loop: take the next prepared desktop, run the attempt on it, record it,
    give the desktop back (recovered first after a desktop failure). ``asked``: when the
    runner asked for its first desktop (``time.perf_counter()``)."""
    while True:
        if asyncio.current_task().cancelling():  # a cancel something below swallowed
            raise asyncio.CancelledError
        if ctx.abort is not None:  # the server refused the batch's settings: no new attempt
            return
        got = await handout.take(asked)
        if got is None:
            return
        handed, prepared, waited, ahead = got
        ex = handed.ex
        if ctx.abort is not None:  # refused while this runner waited: leave it queued
            handout.release(handed.desktop, ran=True)
            return
        # cancelled here: the batch ends, the desktop with it
        record = await run_attempt(
            ctx, ex, handed.desktop, prepared, reset_critical_s=waited, reset_ahead=ahead
        )
        asked = time.perf_counter()
        emit(record)
        if record.final:
            for skipped in sched.finish(ex.group):
                emit(settled_record(ctx, skipped, SKIPPED))
        elif record.status == RETRIED:
            sched.retry(ex, time.time())
        handout.release(handed.desktop, broken=record.env_failure, ran=True)


def _plan(
    sched: Scheduler,
    task_set: TaskSet,
    previous: list[Record],
    *,
    group: int,
    per_group: int,
    seed: int,
) -> None:
    """Queue what is missing: all of a new batch, or on resume every logical attempt of a
    group that has not closed whose last record is missing, ``retried`` (a crash before its
    re-try ran) or an ``error`` of kind ``policy`` / ``env`` (:data:`RERUN_ON_RESUME`: a
    policy-server outage, desktops lost for good), as a new execution numbered after its
    records (the error record stays: a superseded one, counted as a re-try). Closed groups
    are kept as they are."""
    by_attempt: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in previous:
        by_attempt[r.logical_attempt].append(r)
    now = time.time()
    for index, task in enumerate(task_set.tasks):
        g = Group(index=index, task=task, group_id=f"{task.task_id}", size=group)
        todo, executions = [], {}
        for attempt in range(per_group):
            recs = by_attempt.get((task.task_id, attempt), [])
            g.finished += sum(1 for r in recs if r.final)
            if not recs or recs[-1].status == RETRIED or _rerun(recs[-1]):
                todo.append(attempt)
                executions[attempt] = len(recs)
        g.closed = g.finished >= group
        sched.add_group(g, [] if g.closed else todo, seed=seed, now=now, executions=executions)


def _rerun(record: Record) -> bool:
    """An ``error`` record a resume re-runs (its group still open): kind ``policy`` or ``env``."""
    return record.status == ERROR and record.error_kind in RERUN_ON_RESUME


def _preflight(task_set: TaskSet, desktop: DesktopConfig, desktops: int = 1) -> str | None:
    """Refuse tasks that cannot run on the chosen backend (a misspelled metric, a setup step
    missing a parameter, a download that needs the internet, an app the desktops lack...)
    before any desktop starts, rather than grading them 0 one by one: the same verdict as
    ``legato tasks check --backend`` (``desktops/support.py``, ``osworld_format/verdict.py``),
    for ``desktops`` desktops open at once (runners + spares: on the local backend's host
    network they share Chrome's and VLC's ports).
    Returns the grader the run's rewards come from (``osworld`` | ``own``; ``None`` for the
    fake backend, which never grades). Raises ``TaskListError`` listing the problems."""
    from ..desktops.support import backend_support
    from ..osworld_format import preflight

    support = backend_support(desktop.backend, desktop.options, desktops=desktops)
    checks = capabilities(desktop.backend, desktop.options).task_checks  # the verdict's kind
    problems = preflight(task_set, checks, support=support)
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise TaskListError(
            f"{len(problems)} problem(s) with the task list for backend {desktop.backend!r} "
            f"(`legato tasks check` shows them all):\n  {shown}{more}"
        )
    return get(desktop.backend).grader_kind(support)


def _settings(settings: CollectSettings | Mapping[str, Any] | None, knobs: dict) -> CollectSettings:
    """The batch's settings: ``settings`` with the keyword knobs of :func:`collect_async` on
    top. A keyword that is no setting is a ``TypeError`` (as for any function); ``None`` for
    ``step_timeout``, ``retries``, ``ready_signal``, ``fixed_wait`` or ``fast_reset`` means
    "not set" (the policy's / desktop's value). Raises ``ConfigError`` naming a bad knob."""
    unknown = sorted(set(knobs) - set(CollectSettings.model_fields))
    if unknown:
        raise TypeError(f"collect() got an unexpected keyword argument {unknown[0]!r}")
    knobs = {
        k: v
        for k, v in knobs.items()
        if v is not None or k not in OVERRIDES_POLICY + OVERRIDES_DESKTOP
    }
    if isinstance(settings, CollectSettings):
        base = settings.model_dump(exclude_unset=True)
    else:
        base = dict(settings or {})
    return CollectSettings.checked(base | knobs)


def check_knobs(**k: Any) -> CollectSettings:
    """Check collection knobs (fields of :class:`CollectSettings`; the others take their
    defaults) before anything starts and return the settings. Raises ``ConfigError`` naming the
    knob, what a valid value is and its flag."""
    return CollectSettings.checked(k)
