"""One execution of one attempt on one desktop: the step loop (docs/architecture.md §3).

reset -> wait -> [observe -> policy call -> parse -> act -> wait until ready]* -> wait -> grade

Everything it measures goes into the record: per-phase seconds, per-step model stats, per
action act/wait/ready seconds. It raises nothing: every failure becomes the record's status. A
:class:`PolicyConfigError` (a 401, a 404, the image limit: the batch's settings, refused
mid-batch) ends the attempt as ``error`` kind ``config`` with the steps it ran, and sets
``AttemptContext.abort`` (the batch stops taking attempts, then raises it); a
:class:`PolicyRequestError` (a 400 for what this attempt's prompt carries) ends it as
``error`` kind ``request`` and the batch goes on. The attempt is the boundary: any
exception an attempt raises that is not one of the project's own (a truncated PNG from a
desktop, a plain ``OSError``, a bug in a backend) ends that attempt as a desktop failure of
kind ``unexpected`` (retried per ``env_retries``, then ``error`` kind ``env``, with the
exception's type, redacted message and the line that raised it) and the batch goes on. A
context-length 400, or an output the server shortened to fit its context (HTTP 200,
``finish_reason: length``, fewer tokens than ``max_tokens``: vLLM >= 0.32), ends the attempt
as ``truncated`` (graded, ``truncation`` says why; the cut step is recorded, flagged
``truncated``, its actions not run); an evaluator that gives no valid reward (``None``, NaN, +-inf) is a desktop failure of kind ``invalid_reward`` (retried, then
``error``), never a reward.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from .. import record as fmt
from ..desktops.base import Desktop
from ..errors import (
    ContextLengthError,
    DesktopError,
    PolicyConfigError,
    PolicyError,
    PolicyRequestError,
)
from ..policy.response import CONTEXT_LENGTH
from ..policy.wire import redact
from ..record import (
    ActionRecord,
    ErrorInfo,
    ModelCall,
    PolicyRef,
    Record,
    Reset,
    SetupFailure,
    Step,
    StepResponse,
    UnexpectedWindow,
    encode_prompt_ids,
    valid_reward,
)
from ..store.rundir import RunWriter
from .scheduler import Execution

log = logging.getLogger(__name__)


@dataclass
class AttemptContext:
    """What every attempt of a batch shares (built once by the engine)."""

    policy: Any  # PolicyClient
    harness: Any  # legato_pipelines.harness.Harness
    writer: RunWriter
    policy_info: PolicyRef
    task_set: str
    max_steps: int
    rollout_timeout: float | None
    eval_timeout: float
    env_retries: int
    abort: PolicyConfigError | None = None
    """Set by the first attempt that met a configuration error of the server mid-batch (a 401,
    a 404, the image limit): its record is written, the attempts running finish and are
    recorded, no new one starts, and the batch raises it (issue 31)."""


def base_record(ctx: AttemptContext, ex: Execution, desktop: str | None) -> Record:
    """The identity part every record of an execution carries."""
    return Record(
        rollout_id=uuid.uuid4().hex,
        task_id=ex.group.task.task_id,
        domain=ex.group.task.domain,
        group_id=ex.group.group_id,
        attempt=ex.attempt,
        execution=ex.execution,
        policy=ctx.policy_info,
        task_set=ctx.task_set,
        desktop=desktop,
    )


def settled_record(ctx: AttemptContext, ex: Execution, status: str) -> Record:
    """A record for an execution that never ran (``skipped``)."""
    record = base_record(ctx, ex, None)
    record.status = status
    record.started_at = record.ended_at = time.time()
    return record


class _Truncated(Exception):
    """rollout_timeout passed."""


@dataclass
class Prepared:
    """A desktop reset and set up for one execution (:func:`prepare`), possibly ahead of the
    execution's hand-out (docs/architecture.md §3, "desktops prepared ahead").

    ``started_at`` (Unix seconds) / ``t0`` (``time.perf_counter()``) when the reset began;
    ``reset_s`` seconds of reset + setup + ready wait; ``reset`` the record's :class:`Reset`
    when it worked, else ``error`` the :class:`DesktopError` it failed with (the attempt then
    ends as a desktop failure in phase ``reset``, exactly as a reset at hand-out would).
    """

    started_at: float
    t0: float
    reset_s: float = 0.0
    reset: Reset | None = None
    error: DesktopError | None = None

    @property
    def ready(self) -> bool:
        """The reset and its setup worked and the screen was reported ready (or waited for)."""
        return self.error is None and self.reset is not None


async def prepare(desktop: Desktop, ex: Execution) -> Prepared:
    """Reset ``desktop`` to ``ex``'s task (``reset`` + the task's setup + ``wait_after_reset``)
    and return what happened. Raises nothing but ``asyncio.CancelledError``: a desktop failure
    (or any other exception, as :func:`unexpected`) is kept in ``Prepared.error``."""
    prepared = Prepared(started_at=time.time(), t0=time.perf_counter())
    try:
        kind = await desktop.reset(ex.group.task, seed=ex.seed)
        wait = await desktop.wait_after_reset()
        prepared.reset = Reset(
            kind=kind, ready_s=wait.ready_s, wait_s=wait.wait_s, timed_out=wait.timed_out
        )
        if wait.undrawn:  # written only when set: step 0's screen shows an app undrawn
            prepared.reset.undrawn = True
        # what OSWorld carries on after (a setup command that exited non-zero, ...): facts
        setup_failures = list(getattr(desktop, "setup_failures", None) or [])
        if setup_failures:
            prepared.reset.setup_failures = [SetupFailure(**f) for f in setup_failures]
    except DesktopError as exc:
        prepared.error = exc
    except Exception as exc:  # noqa: BLE001 - the attempt boundary (module doc)
        prepared.error = unexpected(exc)
    prepared.reset_s = time.perf_counter() - prepared.t0
    return prepared


async def run_attempt(
    ctx: AttemptContext,
    ex: Execution,
    desktop: Desktop,
    prepared: Prepared | None = None,
    *,
    reset_critical_s: float | None = None,
    reset_ahead: bool | None = None,
) -> Record:
    """Run one execution on ``desktop`` and return its record (status set).

    ``prepared``: the desktop already reset for ``ex`` (:func:`prepare`, e.g. while another
    attempt ran); ``None`` resets it here. ``reset_critical_s`` [s] / ``reset_ahead``: how
    long the attempt waited for its desktop and whether it was ready before its runner asked
    (recorded as ``timing.reset_critical_s`` / ``timing.reset_ahead``; ``None``: not
    measured). ``rollout_timeout`` counts the reset's own seconds, not the time a prepared
    desktop sat ready.

    A ``DesktopError`` (in the reset too) gives status ``retried`` (the caller re-queues) or,
    when ``env_retries`` is used up, ``error`` kind ``env``; the caller must ``recover()`` the
    desktop. Any other exception that is not the project's own does the same with error type
    ``unexpected`` (:func:`unexpected`). A ``PolicyError`` gives ``error`` kind ``policy``, a
    ``PolicyRequestError`` kind ``request``, a ``PolicyConfigError`` kind ``config`` (and
    sets ``ctx.abort``: the caller stops taking attempts); cancellation
    (``asyncio.CancelledError``) propagates.
    What the desktop did on its own around the reset (``desktop.reset_facts``: a keyboard
    layout restored, unexpected windows closed before the policy's first action) goes into
    ``record.reset``, however the execution ended; so does what a grader process wrote for
    this execution (``desktop.take_grader_log()``), stored in the run directory and named by
    ``record.grader_log``.
    """
    record = base_record(ctx, ex, desktop.name)
    if reset_critical_s is not None:
        record.timing.reset_critical_s = reset_critical_s
        record.timing.reset_ahead = reset_ahead
    try:
        if prepared is None:
            prepared = await prepare(desktop, ex)
        return await _run(ctx, ex, desktop, record, prepared)
    finally:
        _add_reset_facts(record, desktop)
        _keep_grader_log(ctx, record, desktop)


def _keep_grader_log(ctx: AttemptContext, record: Record, desktop: Desktop) -> None:
    """Store what the desktop's grader process wrote for this execution in the run directory
    (it would go with the batch's work directory) and name it on the record. A log that
    cannot be read or written is left out: it never changes how the execution ended."""
    take = getattr(desktop, "take_grader_log", None)
    if take is None:
        return
    try:
        data = take()
        if data:
            record.grader_log = ctx.writer.store_grader_log(record.rollout_id, data)
    except OSError as exc:
        log.warning(
            "%s: the grader's log of %s was not kept: %s", desktop.name, record.rollout_id, exc
        )


def _add_reset_facts(record: Record, desktop: Desktop) -> None:
    facts = getattr(desktop, "reset_facts", None) or {}
    if record.reset is None or not facts:
        return
    if facts.get("keyboard_restored"):
        record.reset.keyboard_restored = str(facts["keyboard_restored"])
    if facts.get("unexpected_windows"):
        record.reset.unexpected_windows = [
            UnexpectedWindow(**w) for w in facts["unexpected_windows"]
        ]


async def _run(
    ctx: AttemptContext, ex: Execution, desktop: Desktop, record: Record, prepared: Prepared
) -> Record:
    timing = record.timing
    start = prepared.started_at
    record.started_at = start
    timing.queue_s = max(0.0, start - ex.enqueued_at)
    t0 = prepared.t0
    deadline = (
        None
        if ctx.rollout_timeout is None
        else time.perf_counter() + ctx.rollout_timeout - prepared.reset_s
    )
    group = ex.group
    task = group.task
    phase = "reset"
    outcome = None
    status = fmt.OK
    if prepared.error is not None:
        return _desktop_failure(ctx, record, ex, prepared.error, phase, start, t0)
    try:
        record.reset = prepared.reset
        timing.reset_s = prepared.reset_s
        episode = ctx.harness.episode(task.instruction, desktop.screen_size)
        resizes = observes_at_size(desktop)
        steps = record.steps
        hashes: dict[
            int, tuple[dict, str]
        ] = {}  # id(message) -> (message, sha): hash each message once
        prompt_ids: list[int] | None = None  # the last prompt ids the server returned
        for step in range(ctx.max_steps):
            if group.closed:
                outcome = "cancelled"
                break
            if deadline is not None and time.perf_counter() >= deadline:
                raise _Truncated
            phase = "observe"
            t = time.perf_counter()
            if resizes:  # the desktop hands out the model-size PNG: no pixel work here
                raw = await desktop.observe(size=episode.model_size)
            else:
                raw = await desktop.observe()
            if not raw.complete():
                raise ValueError(
                    f"the screenshot is half a PNG ({len(raw.png)} bytes, no IEND chunk)"
                )
            # resizing is CPU work (decode, resize, encode): keep it off the event loop
            shot = episode.prepared(raw) or await asyncio.to_thread(episode.prepare, raw)
            obs_s = time.perf_counter() - t
            timing.obs_s += obs_s
            messages = episode.request(shot)
            request = []
            for message in messages:
                entry = hashes.get(id(message))
                if entry is None or entry[0] is not message:
                    entry = (message, ctx.writer.store_message(message))
                    hashes[id(message)] = entry
                request.append(entry[1])
            ctx.writer.store_image(shot)
            phase = "policy"
            seed = ctx.policy.config.request_seed(task.task_id, group.group_id, ex.attempt, step)
            t = time.perf_counter()
            call = ctx.policy.complete(messages, episode.images, seed=seed)
            if deadline is None:
                response = await call
            else:
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                    # cancel that races the call's end, and the cancelled batch runs on
                    async with asyncio.timeout(max(0.0, deadline - time.perf_counter())):
                        response = await call
                except TimeoutError:
                    timing.policy_s += time.perf_counter() - t
                    raise _Truncated from None
            timing.policy_s += time.perf_counter() - t
            # the answer wherever the server's parsers put it (content, tool_calls, reasoning)
            answer, answer_field = response.answer()
            cut = response.cut(ctx.policy.config.output_limit)
            parsed = episode.parse(answer, response.finish_reason)
            episode.record(answer, parsed)
            step_record = Step(
                step=step,
                request=request,
                response=StepResponse(**response.response_record()),
                model=ModelCall(**response.model_record()),
                action_text=parsed.action_text,
                parse_error=parsed.parse_error,
                obs_s=obs_s,
                observation=shot.sha,
            )
            if response.prompt_token_ids is not None:
                step_record.prompt_ids = encode_prompt_ids(prompt_ids, response.prompt_token_ids)
                prompt_ids = response.prompt_token_ids
            if seed is not None:
                step_record.seed = seed
            if answer_field != "content" and answer_field is not None:
                step_record.answer_field = answer_field
            if cut is not None:
                step_record.truncated = cut
            steps.append(step_record)
            record.n_steps = len(steps)
            if cut == CONTEXT_LENGTH:
                # the server shortened the output to fit its context: the prompt has no room
                # left for another step; this step's (cut) actions are not run
                outcome, status = "context_length", fmt.TRUNCATED
                record.truncation = (
                    f"the output was cut at the model's context (HTTP 200, finish_reason "
                    f"length after {response.completion_tokens} of max_tokens "
                    f"{ctx.policy.config.output_limit} tokens, prompt {response.prompt_tokens} "
                    "tokens) (fix: lower --image-max or --max-tokens, or raise the server's "
                    "--max-model-len)"
                )
                break
            phase = "act"
            for action in parsed.actions:
                if action.action == "terminate":
                    continue
                done = ActionRecord(**action.to_record())
                t = time.perf_counter()
                facts = await desktop.act(action)
                done.act_s = time.perf_counter() - t
                if facts and facts.get("not_typed"):  # text that did not reach the desktop
                    done.not_typed = str(facts["not_typed"])
                timing.act_s += done.act_s
                wait = await desktop.wait_after_action(action)
                done.wait_s = wait.wait_s
                done.ready_s = wait.ready_s
                done.timed_out = wait.timed_out
                if wait.undrawn:  # written only when set: the next screen shows it undrawn
                    done.undrawn = True
                timing.wait_s += wait.wait_s
                step_record.actions.append(done)
            if parsed.terminal:
                outcome = parsed.terminal
                break
        else:
            outcome = "max_steps"
        if outcome == "cancelled":
            record.status = fmt.CANCELLED
            return _close(record, start, t0)
    except _Truncated:
        outcome, status = "timeout", fmt.TRUNCATED
    except PolicyConfigError as exc:
        # the batch's settings, refused mid-batch: this attempt is recorded with its steps,
        # the batch stops taking attempts (the engine raises ctx.abort once they are recorded)
        if ctx.abort is None:
            ctx.abort = exc
        return _policy_failure(record, exc, fmt.CONFIG, phase, start, t0)
    except PolicyRequestError as exc:
        # a 400 for what this attempt's prompt carries: this attempt only
        return _policy_failure(record, exc, fmt.REQUEST, phase, start, t0)
    except ContextLengthError as exc:
        # the prompt outgrew the model's context: this attempt ends here, the batch goes on
        outcome, status = "context_length", fmt.TRUNCATED
        record.truncation = str(exc)
    except PolicyError as exc:
        return _policy_failure(record, exc, fmt.POLICY, phase, start, t0)
    except DesktopError as exc:
        return _desktop_failure(ctx, record, ex, exc, phase, start, t0)
    except Exception as exc:  # noqa: BLE001 - the attempt boundary (module doc)
        return _desktop_failure(ctx, record, ex, unexpected(exc), phase, start, t0)
    record.outcome = outcome
    phase = "evaluate"
    t = time.perf_counter()
    try:
        await desktop.wait_before_eval()
        async with asyncio.timeout(ctx.eval_timeout):
            evaluation = await desktop.evaluate(task, last_action_fail=outcome == "fail")
    except TimeoutError:
        timing.eval_s = time.perf_counter() - t
        exc = DesktopError(
            f"evaluation took longer than eval_timeout={ctx.eval_timeout:g} s (hung evaluator)",
            kind="evaluator",
        )
        return _desktop_failure(ctx, record, ex, exc, phase, start, t0)
    except DesktopError as exc:
        timing.eval_s = time.perf_counter() - t
        return _desktop_failure(ctx, record, ex, exc, phase, start, t0)
    except Exception as exc:  # noqa: BLE001 - the attempt boundary (module doc)
        timing.eval_s = time.perf_counter() - t
        return _desktop_failure(ctx, record, ex, unexpected(exc), phase, start, t0)
    timing.eval_s = time.perf_counter() - t
    if not valid_reward(evaluation.reward):
        exc = DesktopError(
            f"the evaluator gave no valid reward ({evaluation.reward!r}"
            + (f": {evaluation.error}" if evaluation.error else "")
            + "): an evaluator error, not a reward",
            kind="invalid_reward",
        )
        return _desktop_failure(ctx, record, ex, exc, phase, start, t0)
    record.reward = float(evaluation.reward)
    record.eval_error = evaluation.error
    if evaluation.notes:  # what explains the grade (uncached formulas, ...): facts, not a change
        record.eval_notes = list(evaluation.notes)
    if evaluation.postconfig_failures:  # steps after the policy's end OSWorld carries on after
        record.postconfig_failures = [SetupFailure(**f) for f in evaluation.postconfig_failures]
    record.status = fmt.SURPLUS if group.closed else status
    return _close(record, start, t0)


def observes_at_size(desktop: Desktop) -> bool:
    """Whether the engine asks ``desktop`` for the model-size screenshot (``observe(size=)``):
    its class says it can (``observe_resizes = True``) and its ``observe`` takes ``size`` (a
    subclass that overrides ``observe()`` without it gets the collector-side resize)."""
    if getattr(desktop, "observe_resizes", False) is not True:
        return False
    return _takes_size(getattr(type(desktop), "observe", None))


@functools.cache
def _takes_size(observe) -> bool:
    try:
        return "size" in inspect.signature(observe).parameters
    except (TypeError, ValueError):
        return False


def unexpected(exc: BaseException) -> DesktopError:
    """``exc`` (not one of the project's own errors) as a :class:`DesktopError` of kind
    ``unexpected``: ``"<Type>: <message> (at <file>:<line>)"``, the message redacted (no policy
    key) and cut to 500 characters, the place the innermost frame that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    message = redact(str(exc))[:500]
    error = DesktopError(f"{type(exc).__name__}: {message}{where}", kind="unexpected")
    error.__cause__ = exc
    return error


def _policy_failure(
    record: Record, exc: PolicyError, kind: str, phase: str, start: float, t0: float
) -> Record:
    """``record`` ended by a failed model call: status ``error``, ``error.kind`` ``kind``
    (``policy`` | ``request`` | ``config``), the exception's type and (redacted) message, the
    HTTP requests made for the call."""
    record.status = fmt.ERROR
    record.error = ErrorInfo(
        kind=kind,
        type=type(exc).__name__,
        message=str(exc),
        phase=phase,
        attempts=exc.attempts,  # HTTP requests made for the failed call
    )
    return _close(record, start, t0)


def _desktop_failure(
    ctx, record: Record, ex: Execution, exc: DesktopError, phase: str, start: float, t0: float
) -> Record:
    record.error = ErrorInfo(kind=fmt.ENV, type=exc.kind, message=str(exc), phase=phase)
    record.status = fmt.RETRIED if ex.execution < ctx.env_retries else fmt.ERROR
    return _close(record, start, t0)


def _close(record: Record, start: float, t0: float) -> Record:
    timing = record.timing
    timing.total_s = time.perf_counter() - t0 + timing.queue_s
    record.ended_at = start + (time.perf_counter() - t0)
    for key in type(timing).model_fields:
        value = getattr(timing, key)
        if isinstance(value, float):
            setattr(timing, key, round(value, 6))
    return record
