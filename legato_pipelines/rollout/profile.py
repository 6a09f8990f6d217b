"""The profile of a batch (docs/architecture.md §7): what ``summary.json``, ``legato profile``
and the ``profile`` table report. Computed from the records alone, so it can be recomputed any time.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import record as fmt
from ..record import Record, Step, as_records
from ..store.rundir import read_meta, read_typed_records

TIME_PHASES = tuple(f"{phase}_s" for phase in fmt.TIME_PHASES)


def summarize(
    records: Iterable[Record | Mapping[str, Any]],
    meta: dict[str, Any],
    *,
    wall_s: float | None = None,
    scheduled: int | None = None,
    groups: list | None = None,
) -> dict[str, Any]:
    """The summary of a batch.

    Definitions: ``success_rate`` is the mean reward over the ``ok``+``truncated`` attempts
    with a valid reward (``graded`` of them; OSWorld's score convention: a reward is in
    [0, 1]; ``None`` only when none was graded); ``rollouts_per_hour`` counts those
    attempts per hour of wall time, ``wall_s`` (seconds), the session's when the caller gives
    it, else the records' span from the first start to the last end (``wall_of``: ``session``
    or ``records``); ``time_share`` is each phase's share of the summed phase
    seconds of executed attempts; ``model_call_s`` percentiles are over every model call;
    ``policy_errors`` / ``request_errors`` / ``config_errors`` / ``env_errors`` count ``error``
    records by ``error.kind``; ``retried_calls`` are calls that needed more than one HTTP request, ``hung_calls`` the
    requests cut at ``step_timeout`` (in completed steps, and every request of a call that failed
    with ``PolicyTimeout``); ``prefix_cache_hit_rate`` is cached / prompt tokens over
    the calls that reported cached tokens (``None`` when none did); ``logprobs_share`` /
    ``token_ids_share`` are shares of steps whose response carried them; ``reset_critical``
    is the reset on the critical path per app and overall (:func:`reset_critical`); ``ready_timeouts`` counts
    the actions whose ready wait hit its cap (:func:`ready_timeouts`), ``reset_timeouts`` the
    resets whose did (:func:`reset_timeouts`); ``undrawn_observations`` the observations
    handed out with an app still undrawn (:func:`undrawn_observations`); ``not_typed_actions``
    counts ``type`` actions whose text did not all reach the desktop (``not_typed`` on the
    action: characters the desktop could not type); ``eval_errors`` counts
    graded attempts whose evaluator failed (scored 0 with the reason in ``eval_error``);
    ``setup_failures`` / ``postconfig_failures`` count the attempts whose task setup / whose
    evaluator's postconfig had a step OSWorld carries on after (:func:`_setup_failures`,
    :func:`_postconfig_failures`);
    ``keyboard_restores`` counts resets that restored a keyboard layout an earlier attempt had
    switched (:func:`_keyboard_restores`); ``unexpected_windows`` counts attempts whose desktop
    closed a window nobody asked for before the policy's first action
    (:func:`_unexpected_windows`); ``eval_notes`` counts graded attempts whose evaluator
    noted a fact about the compared files
    (:func:`_eval_notes`; the reward is OSWorld's, unchanged); ``web_replay_missing`` counts
    attempts replayed from a web archive that lacked requests, and those requests
    (:func:`_web_replay_missing`). ``missing`` is the
    number of logical attempts without a settling record (0 after a complete batch) and
    ``retries`` the records a later execution of their logical attempt replaced (``retried``,
    or an ``error`` a resume re-ran: :func:`~legato_pipelines.record.superseded`), so
    ``records == scheduled - missing + retries``; ``incomplete`` is :func:`incomplete` (the
    groups left open and their errors by kind: what a resume re-runs). ``sampling`` is ``run.json``'s sampling
    settings; ``quality`` is :func:`quality`.
    """
    records = as_records(records)
    knobs = meta.get("knobs", {})
    counts = Counter(r.status for r in records)
    final = [r for r in records if r.final]
    rewards = [float(r.reward) for r in final if r.reward_valid]
    replaced = fmt.superseded(records)
    logical_done = {
        r.logical_attempt for r, gone in zip(records, replaced, strict=True) if not gone
    }
    if scheduled is None:
        per_group = knobs.get("group", 0) + int(
            math.ceil(knobs.get("group", 0) * knobs.get("oversample", 0) - 1e-9)
        )
        scheduled = per_group * meta.get("n_tasks", 0) or len({r.logical_attempt for r in records})
    wall_of = "session"
    if wall_s is None:
        wall_of = "records"
        wall_s = (
            (max(r.ended_at for r in records) - min(r.started_at for r in records))
            if records
            else 0.0
        )
    phase_totals = dict.fromkeys(TIME_PHASES, 0.0)
    steps: list[Step] = []
    for r in records:
        for phase in fmt.TIME_PHASES:
            phase_totals[f"{phase}_s"] += r.timing.phase(phase)
        steps.extend(r.steps)
    phase_sum = sum(phase_totals.values())
    call_s = [float(s.model.seconds) for s in steps]
    cache = [
        (s.model.cached_tokens, s.model.prompt_tokens)
        for s in steps
        if s.model.cached_tokens is not None and s.model.prompt_tokens
    ]
    errors = Counter(r.error_kind for r in records if r.status == fmt.ERROR and r.error)
    env_failures = sum(1 for r in records if r.env_failure)
    env_kinds = Counter(r.error.type for r in records if r.env_failure and r.error)
    group_final = defaultdict(int)
    for r in final:
        group_final[r.task_id] += 1
    n_groups = (
        len(groups)
        if groups is not None
        else meta.get("n_tasks") or len({r.task_id for r in records})
    )
    closed_tasks = (
        {g.task.task_id for g in groups if g.closed}
        if groups is not None
        else {t for t, n in group_final.items() if n >= knobs.get("group", 1)}
    )
    closed = len(closed_tasks)
    return {
        "format": meta.get("format"),
        "policy": meta.get("policy"),
        "task_set": meta.get("task_set"),
        "tasks_path": meta.get("tasks_path"),
        "knobs": knobs,
        "counts": {s: counts.get(s, 0) for s in fmt.STATUSES},
        "scheduled": scheduled,
        "retries": sum(replaced),
        "records": len(records),
        "missing": max(0, scheduled - len(logical_done)),
        "groups": {"total": n_groups, "closed": closed},
        "incomplete": incomplete(records, replaced, closed_tasks, n_groups),
        "success_rate": statistics.fmean(rewards) if rewards else None,
        "graded": len(rewards),
        "rollouts_per_hour": (len(final) / wall_s * 3600.0) if wall_s > 0 else None,
        "wall_s": round(wall_s, 6),
        "wall_of": wall_of,
        "steps": len(steps),
        "time_share": {
            p[:-2]: (phase_totals[p] / phase_sum if phase_sum else 0.0) for p in TIME_PHASES
        },
        "model_call_s": _percentiles(call_s),
        "retried_calls": sum(1 for s in steps if s.model.attempts > 1),
        "hung_calls": sum(s.model.timeouts for s in steps)
        + sum(
            1 if r.error.attempts is None else r.error.attempts
            for r in records
            if r.error and r.error.type == "PolicyTimeout"
        ),
        "policy_errors": errors.get(fmt.POLICY, 0),
        "request_errors": errors.get(fmt.REQUEST, 0),
        "config_errors": errors.get(fmt.CONFIG, 0),
        "env_errors": errors.get(fmt.ENV, 0),
        "env_failures": env_failures,
        "env_failure_kinds": dict(sorted(env_kinds.items())),
        "prefix_cache_hit_rate": (sum(c for c, _ in cache) / sum(p for _, p in cache))
        if cache
        else None,
        "logprobs_share": _share(steps, "logprobs"),
        "token_ids_share": _share(steps, "token_ids"),
        "parse_errors": sum(1 for s in steps if s.parse_error),
        "ready_timeouts": ready_timeouts(steps),
        "reset_timeouts": reset_timeouts(records),
        "undrawn_observations": undrawn_observations(records),
        "not_typed_actions": sum(1 for s in steps for a in s.actions or () if a.not_typed),
        "eval_errors": sum(1 for r in final if r.eval_error),
        "setup_failures": _setup_failures(records),
        "postconfig_failures": _postconfig_failures(records),
        "keyboard_restores": _keyboard_restores(records),
        "unexpected_windows": _unexpected_windows(records),
        "eval_notes": _eval_notes(records),
        "web_replay_missing": _web_replay_missing(records),
        "desktops": desktop_health(records),
        "reset_critical": reset_critical(records),
        "sampling": meta.get("sampling"),
        "quality": quality(records, steps, knobs, meta.get("sampling") or {}),
    }


def incomplete(
    records: list[Record], replaced: list[bool], closed_tasks: set[str], n_groups: int
) -> dict[str, Any]:
    """What a resume would re-run: ``groups`` of the ``n_groups`` that have not closed, and
    ``errors`` by ``error.kind`` among the records that settle a logical attempt of those groups
    (``replaced``: :func:`~legato_pipelines.record.superseded` of ``records``; a resume re-runs
    errors of kind :data:`~legato_pipelines.record.RERUN_ON_RESUME`). A group has ``group +
    ceil(group x oversample)`` attempts and closes at ``group`` ok/truncated ones, so after a
    complete batch a group stays open only when attempts of it ended in error."""
    errors = Counter(
        r.error_kind or "?"
        for r, gone in zip(records, replaced, strict=True)
        if not gone and r.status == fmt.ERROR and r.task_id not in closed_tasks
    )
    return {"groups": max(0, n_groups - len(closed_tasks)), "errors": dict(sorted(errors.items()))}


def incomplete_message(summary: Mapping[str, Any]) -> str | None:
    """The line that ends a batch whose groups did not all close (``legato collect`` exits 1,
    the ``rollout_batch`` asset fails), or ``None`` when every group closed: how many groups
    are incomplete, their attempts' errors by kind (``summary["incomplete"]``) and that
    re-running the same command resumes them (a resume re-runs those attempts: the engine's
    ``_plan``)."""
    left = summary.get("incomplete") or {}
    if not left.get("groups"):
        return None
    errors = ", ".join(f"{kind} {n}" for kind, n in (left.get("errors") or {}).items())
    graded = sum(summary["counts"].get(s, 0) for s in fmt.FINAL_FOR_TRAINING)
    head = (
        "no attempt was graded (every record is an error, skipped or cancelled): "
        if summary["records"] and not graded
        else ""
    )
    return (
        f"{head}{left['groups']} of {summary['groups']['total']} groups incomplete"
        + (f" (attempts ended in error: {errors})" if errors else "")
        + "; run the same command again to resume them"
    )


def _note_count(notes: list[str], prefix: str) -> int:
    """N of a ``"<prefix>: N"`` note (1 for a bare ``prefix``), summed over ``notes``."""
    total = 0
    for note in notes:
        if str(note).startswith(prefix):
            _, _, n = str(note).partition(": ")
            total += int(n) if n.isdigit() else 1
    return total


def quality(
    records: list[Record], steps: list[Step], knobs: Mapping[str, Any], sampling: Mapping[str, Any]
) -> dict[str, Any]:
    """How far a trainer can trust the batch's numbers (counts; shares in [0, 1]):

    ``graded`` final attempts with a valid reward (the success rate's denominator);
    ``invalid_rewards`` executions whose evaluator gave no valid reward (NaN, inf, None: an
    evaluator error, excluded from groups and samples); ``length_mismatches`` /
    ``logprob_sentinel_steps`` steps whose ids and logprobs disagree / that hold sentinel
    logprobs; ``logprobs_valid_share`` steps whose logprobs an importance ratio can use;
    ``server_aborts`` HTTP 200 answers that were aborted or empty (re-tried as server
    failures); ``context_length_truncations`` attempts ended at the context (a context-length
    400, or an output the server shortened to fit: HTTP 200, ``finish_reason: length``), with
    ``advice`` naming the settings to change; ``truncated_outputs`` steps whose output was cut,
    by why (``Step.truncated``: ``max_tokens`` | ``context_length``); ``answers_outside_content``
    steps whose answer was read from ``reasoning`` or ``tool_calls`` (``Step.answer_field``);
    ``prompt_token_ids_share`` steps with the server's prompt ids stored.
    """
    from ..store.export import step_quality  # store.export imports nothing of the engine

    flags = [step_quality(s) for s in steps]
    context = [r for r in records if r.outcome == "context_length"]
    aborts = sum(_note_count(s.model.notes or [], "server_aborts") for s in steps) + sum(
        1
        for r in records
        if r.error is not None
        and r.error.kind == fmt.POLICY
        and (
            'finish_reason "abort"' in (r.error.message or "")
            or "empty answer" in (r.error.message or "")
        )
    )
    out: dict[str, Any] = {
        "graded": sum(1 for r in records if r.final and r.reward_valid),
        "invalid_rewards": sum(
            1 for r in records if r.error is not None and r.error.type == "invalid_reward"
        ),
        "length_mismatches": sum(1 for f in flags if f["length_mismatch"]),
        "logprob_sentinel_steps": sum(1 for f in flags if f["logprob_sentinels"]),
        "logprobs_valid_share": (sum(1 for f in flags if f["logprobs_valid"]) / len(flags))
        if flags
        else None,
        "server_aborts": aborts,
        "context_length_truncations": len(context),
        "truncated_outputs": dict(
            sorted(Counter(s.truncated for s in steps if s.truncated).items())
        ),
        "answers_outside_content": sum(1 for s in steps if s.answer_field),
        "prompt_token_ids_share": (sum(1 for s in steps if s.prompt_ids is not None) / len(steps))
        if steps
        else None,
    }
    if context:
        out["advice"] = (
            f"{len(context)} attempt(s) outgrew the model's context: lower --image-max "
            f"(now {knobs.get('image_max')}) or --max-tokens (now {sampling.get('max_tokens')}), "
            "or raise the server's --max-model-len"
        )
    return out


def ready_timeouts(steps: list[Step]) -> dict[str, Any]:
    """Actions whose ready wait hit its cap (``timed_out`` in the action's record): ``count``,
    and ``share`` of the actions that had a ready wait (``None`` when none had: fixed waits,
    or records from before ``timed_out`` was recorded)."""
    flags = [a.timed_out for s in steps for a in s.actions or () if a.timed_out is not None]
    return {"count": sum(flags), "share": sum(flags) / len(flags) if flags else None}


def undrawn_observations(records: Iterable[Record]) -> dict[str, Any]:
    """Observations handed to the policy while an app's window was still blank or the app still
    loading: ``count`` of the flagged ready waits (``reset.undrawn``: step 0's observation;
    an action's ``undrawn``: the next step's), ``resets`` and ``actions`` of them (issue 33)."""
    records = list(records)
    resets = sum(1 for r in records if r.reset and r.reset.undrawn)
    actions = sum(1 for r in records for s in r.steps or () for a in s.actions or () if a.undrawn)
    return {"count": resets + actions, "resets": resets, "actions": actions}


def reset_timeouts(records: Iterable[Record]) -> dict[str, Any]:
    """Resets whose ready wait hit its cap (``reset.timed_out``; the cap is the desktop's
    ``ready_after_reset_s``, or ``ready_app_window_s`` while an app the setup launched has
    no main window yet): ``count``, and ``share`` of the resets that had a ready wait (``None`` when
    none had). The attempt then starts on a screen that may still be changing (e.g. GIMP's
    main window not up yet), so its first actions may land nowhere."""
    flags = [r.reset.timed_out for r in records if r.reset and r.reset.timed_out is not None]
    return {"count": sum(flags), "share": sum(flags) / len(flags) if flags else None}


def desktop_health(records: Iterable[Record | Mapping[str, Any]]) -> dict[str, Any]:
    """Which desktops a batch used, lost and recovered, from the records alone.

    ``used``: desktops that ran at least one execution. ``env_failures``: per desktop, its
    executions that ended in a desktop (``env``) error. ``recovered``: desktops that ran
    another execution after such a failure. ``lost``: desktops whose last execution was such a
    failure (the desktop was given up, or the batch ended before it got more work). Records are
    in the order they were written, which per desktop is the order its executions ran.
    """
    last_failed: dict[str, bool] = {}
    failures: Counter = Counter()
    recovered: set[str] = set()
    for r in as_records(records):
        name = r.desktop
        if not name:
            continue
        if last_failed.get(name):
            recovered.add(name)
        failed = r.env_failure
        if failed:
            failures[name] += 1
        last_failed[name] = failed
    return {
        "used": len(last_failed),
        "env_failures": dict(sorted(failures.items())),
        "recovered": sorted(recovered),
        "lost": sorted(n for n, failed in last_failed.items() if failed),
    }


def reset_critical(records: Iterable[Record | Mapping[str, Any]]) -> dict[str, Any]:
    """The reset on the critical path (``timing.reset_critical_s``: seconds an attempt waited
    for a reset, set-up, ready desktop after its runner asked; issue 18) over the executions
    that measured it: ``overall`` and ``by_domain`` (the task's app, e.g. ``libreoffice_calc``),
    each ``{"n", "p50", "p90", "max", "ahead"}`` with seconds rounded to 4 places and ``ahead``
    the share of them whose desktop was prepared ahead (``timing.reset_ahead``). Executions
    from before it was recorded count in none; ``overall`` is all ``None`` when none did."""
    by_domain: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for r in as_records(records):
        waited = r.timing.reset_critical_s
        if waited is not None:
            by_domain[r.domain or "-"].append((float(waited), bool(r.timing.reset_ahead)))
    every = [pair for pairs in by_domain.values() for pair in pairs]
    return {
        "overall": _critical(every),
        "by_domain": {d: _critical(pairs) for d, pairs in sorted(by_domain.items())},
    }


def _critical(pairs: list[tuple[float, bool]]) -> dict[str, Any]:
    if not pairs:
        return {"n": 0, "p50": None, "p90": None, "max": None, "ahead": None}
    ordered = sorted(s for s, _ in pairs)
    return {
        "n": len(pairs),
        "p50": round(percentile(ordered, 50), 4),
        "p90": round(percentile(ordered, 90), 4),
        "max": round(ordered[-1], 4),
        "ahead": sum(1 for _, ahead in pairs if ahead) / len(pairs),
    }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)
    return {f"p{q}": round(percentile(ordered, q), 4) for q in (50, 95, 99)}


def percentile(ordered: list[float], q: float) -> float:
    """The ``q``-th percentile of the sorted ``ordered`` as ``numpy.percentile`` computes it
    by default (linear interpolation between the closest ranks, numpy's own lerp), without
    importing numpy (~0.1 s of every ``legato collect``'s start-up)."""
    position = (len(ordered) - 1) * (q / 100)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    a, b, t = ordered[below], ordered[above], position - below
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def _setup_failures(records: list[Record]) -> dict[str, Any]:
    """Attempts whose setup had a step OSWorld carries on after (``reset.setup_failures``):
    how many, and the count per ``task_id`` and step type (``{"attempts", "by_step"}``)."""
    return _step_failures(records, lambda r: r.reset.setup_failures if r.reset else None)


def _postconfig_failures(records: list[Record]) -> dict[str, Any]:
    """Attempts whose evaluator's postconfig (the steps between the policy's end and the
    grade) had a step OSWorld carries on after (``postconfig_failures``: a failed command, a
    close or activate that found no window): ``{"attempts", "by_step"}`` as
    :func:`_setup_failures`."""
    return _step_failures(records, lambda r: r.postconfig_failures)


def _step_failures(records: list[Record], failures_of) -> dict[str, Any]:
    """``{"attempts", "by_step"}`` over ``failures_of(record)`` (a list of
    :class:`~legato_pipelines.record.SetupFailure` or ``None``): the attempts with any, and
    the count per ``"<task_id> step <i> (<type>)"``, most frequent first."""
    by_step: Counter = Counter()
    attempts = 0
    for r in records:
        failures = failures_of(r) or []
        if failures:
            attempts += 1
        for f in failures:
            by_step[f"{r.task_id} step {f.step} ({f.type})"] += 1
    return {"attempts": attempts, "by_step": dict(by_step.most_common())}


def _keyboard_restores(records: list[Record]) -> dict[str, Any]:
    """Attempts whose reset found the keyboard layout changed by an earlier attempt and restored
    the desktop's own (``reset.keyboard_restored``): how many, and the count per change
    (``{"attempts", "by_change"}``, e.g. ``{"layout de -> us": 2}``)."""
    changes = Counter(
        r.reset.keyboard_restored for r in records if r.reset and r.reset.keyboard_restored
    )
    return {"attempts": sum(changes.values()), "by_change": dict(changes.most_common())}


def _unexpected_windows(records: list[Record]) -> dict[str, Any]:
    """Attempts on whose desktop a window nobody asked for appeared after the reset and before
    the policy's first action, and was closed (``reset.unexpected_windows``): how many, and
    the count per window and outcome (``{"attempts", "by_window"}``, e.g.
    ``{"XTerm 'Updates' (closed)": 2}``). A fact of the desktop, never the policy's failure."""
    by_window: Counter = Counter()
    attempts = 0
    for r in records:
        windows = (r.reset.unexpected_windows if r.reset is not None else None) or []
        if windows:
            attempts += 1
        for w in windows:
            by_window[f"{w.wm_class} {w.title!r} ({w.outcome})"] += 1
    return {"attempts": attempts, "by_window": dict(by_window.most_common())}


def _eval_notes(records: list[Record]) -> dict[str, Any]:
    """Graded attempts whose evaluator noted a fact about what it compared (``eval_notes``,
    e.g. an xlsx whose formulas hold no cached values): how many, and the notes per kind (the
    text before ``": "``) as ``{"attempts", "by_kind"}``."""
    by_kind: Counter = Counter()
    attempts = 0
    for r in records:
        if r.final and r.eval_notes:
            attempts += 1
            by_kind.update(str(n).partition(": ")[0] for n in r.eval_notes)
    return {"attempts": attempts, "by_kind": dict(by_kind.most_common())}


#: The note a replayed attempt carries for requests its web archive lacked
#: (``desktops/web.py`` WEB_MISS_NOTE: ``web_replay_missing: N request(s) ...``).
_WEB_MISS = re.compile(r"^web_replay_missing: (\d+) request")


def _web_replay_missing(records: list[Record]) -> dict[str, Any]:
    """Graded attempts replayed from a web archive that lacked some of their requests
    (desktop option ``web=replay:``), and how many requests in all: ``{"attempts",
    "requests"}``."""
    counts = [
        int(m[1])
        for r in records
        if r.final and r.eval_notes
        for m in (_WEB_MISS.match(str(n)) for n in r.eval_notes)
        if m
    ]
    return {"attempts": len(counts), "requests": sum(counts)}


def _share(steps: list[Step], key: str) -> float | None:
    if not steps:
        return None
    return sum(1 for s in steps if getattr(s.response, key)) / len(steps)


def profile(run_dir: str | Path) -> dict[str, Any]:
    """Recompute the summary of a run directory from its records (no wall time of the session:
    the span from the first start to the last end is used)."""
    return summarize(read_typed_records(run_dir), read_meta(run_dir))
