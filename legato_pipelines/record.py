"""The run record, format ``legato.rollout/v0`` (docs/architecture.md §3, §7): one typed
definition that the writer (the engine) and every reader (profile, export, lake tables,
Dagster assets, CLI) share.

Bottom layer: it imports nothing else from the package.

A line of ``rollouts.jsonl`` is one :class:`Record` (one physical execution of one logical
attempt), with its :class:`Timing`, its :class:`Reset`, an :class:`ErrorInfo` when it failed,
and its :class:`Step` list (each with the model call's :class:`StepResponse` and
:class:`ModelCall` and its :class:`ActionRecord` list). Units: every ``*_s`` field and
``seconds`` is seconds; ``*_tokens`` are tokens; ``started_at``/``ended_at`` are Unix seconds.

Byte compatibility: fields are declared in the order the format has always written them, so
for a line written by the engine (before or after this module existed)
``orjson.dumps(Record.from_json_dict(orjson.loads(line)).to_json_dict()) == line``: same keys,
same order, same values (an int stays an int). Keys absent from a loaded object stay absent;
keys the model does not know (a newer writer's, e.g. an action's ``timed_out``) are kept and
written after the known ones. A record built by the engine writes every field but the optional
ones the format writes only when they apply (``error.attempts``, an action's ``screen``,
``text``...) and that were not set.

Validation checks every field but the per-token lists (token ids, logprobs, token strings),
which are taken as they are: reading a large run directory must stay cheap.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

FORMAT = "legato.rollout/v0"
"""The run directory format: ``run.json``'s and every record's ``format``."""

# Attempt statuses (docs/architecture.md §3). Every execution ends in exactly one record with
# one of these, so ``count(records) == scheduled + retries`` always holds.
OK = "ok"  # the agent said done/fail, or the step limit was reached; graded
TRUNCATED = "truncated"  # rollout_timeout passed: stopped stepping, graded
CANCELLED = "cancelled"  # its group closed while it ran; stopped at its next step
SKIPPED = "skipped"  # its group was full before it started
SURPLUS = "surplus"  # finished (graded) after its group had closed
RETRIED = "retried"  # a desktop failure; a new execution of the same logical attempt follows
ERROR = "error"  # error.kind "policy" / "request" / "config" (the model call) or "env" (desktop)

STATUSES: tuple[str, ...] = (OK, TRUNCATED, CANCELLED, SKIPPED, SURPLUS, RETRIED, ERROR)
"""Every status, in the order reports list them."""
FINAL_FOR_TRAINING: frozenset[str] = frozenset({OK, TRUNCATED})
"""Statuses that count for training (export, advantages, success rate) and close a group."""

Status = Literal["ok", "truncated", "cancelled", "skipped", "surplus", "retried", "error"]

# error.kind
POLICY = "policy"  # the model call failed after its re-tries
ENV = "env"  # the desktop failed (status retried, or error when env_retries are used up)
REQUEST = (
    "request"  # the server refused this attempt's request (a 400 for its prompt); batch goes on
)
CONFIG = (
    "config"  # the server refused the batch's settings (401, 404, the image limit...) mid-batch:
)
# the attempt is recorded with its steps, then the batch stops

PHASES: tuple[str, ...] = ("queue", "reset", "policy", "act", "wait", "obs", "eval")
"""Timing phases of a record (``timing.<phase>_s``), in the order an attempt runs them."""
TIME_PHASES: tuple[str, ...] = PHASES[1:]
"""The phases of executed work (the profile's time share: queueing is not work)."""


def _json(value: Any) -> Any:
    if isinstance(value, _Format):
        return value.to_json_dict()
    if isinstance(value, list) and value and isinstance(value[0], _Format):
        return [item.to_json_dict() for item in value]
    return value


@functools.cache
def _written(cls: type[_Format]) -> frozenset[str]:
    """The fields of ``cls`` a writer-built object always writes (all but its ``OPTIONAL``)."""
    return frozenset(cls.model_fields) - cls.OPTIONAL


def is_final(status: str | None) -> bool:
    """Whether a record of this status counts for training (``ok`` or ``truncated``)."""
    return status in FINAL_FOR_TRAINING


RERUN_ON_RESUME: frozenset[str] = frozenset({POLICY, ENV, CONFIG})
"""``error.kind`` of the ``error`` records a resume re-runs when their group has not closed (a
policy-server outage, a desktop lost for good, a setting the server refused mid-batch and that
was fixed since): a new execution of the same logical attempt. ``request`` errors are not
re-run: the server refused what that attempt's own prompt carried."""


def superseded(records: Iterable[Any]) -> list[bool]:
    """For each record (typed, or a JSON dict / row with ``task_id``, ``attempt``,
    ``execution``, ``status``), whether a later execution of the same logical attempt replaced
    it: status ``retried``, or an ``error`` that a resume re-ran (a record of the same
    ``task_id`` and ``attempt`` with a higher ``execution`` exists). The other records settle
    their logical attempt (one each in a sound run directory), so ``count(records) ==
    scheduled - missing + sum(superseded)``."""

    def get(r: Any, key: str) -> Any:
        return getattr(r, key) if isinstance(r, BaseModel) else r.get(key)

    rows = [
        (get(r, "task_id"), get(r, "attempt"), get(r, "execution") or 0, get(r, "status"))
        for r in records
    ]
    latest: dict[tuple[Any, Any], int] = {}
    for task, attempt, execution, _ in rows:
        key = (task, attempt)
        latest[key] = max(latest.get(key, execution), execution)
    return [
        status == RETRIED or (status == ERROR and execution < latest[(task, attempt)])
        for task, attempt, execution, status in rows
    ]


def _number(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A JSON number kept as it came (an int stays an int: ``0`` must not become ``0.0``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return handler(value)


Seconds = Annotated[float, WrapValidator(_number)]
"""Seconds (or any JSON number), kept exactly as written."""
Number = Seconds


def _long_list(item: type) -> Any:
    """A per-token list (ids, logprobs, token strings: thousands per step): taken and written
    as it is, not checked element by element (the writer's own data; reading a large run
    directory stays close to the speed of reading its JSON)."""
    return Annotated[list[item] | None, SkipValidation]


TokenIds = _long_list(int)
Logprobs = _long_list(float)
Tokens = _long_list(str)


class _Format(BaseModel):
    """A JSON object of the format: unknown keys kept; a key absent from a loaded object stays
    absent (see :meth:`to_json_dict`)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    """Fields the writer leaves out until they are set (``None`` is never written for them)."""

    def model_post_init(self, context: Any, /) -> None:
        # Built by the writer (not loaded): every field is written but the optional ones that
        # were not set. Loaded: exactly the keys the object had (``model_fields_set``).
        if not (context and context.get("json")):
            self.__pydantic_fields_set__ |= _written(type(self))

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]):
        """The typed form of one JSON object of the format (as ``orjson.loads`` gives it).
        Raises ``pydantic.ValidationError`` when it is not one."""
        return cls.model_validate(data, context={"json": True})

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object, ready for ``orjson.dumps``: the fields that were loaded or set (a
        writer-built object: all but the unset optional ones), in the declared order (the
        format's), then the unknown keys; values as they are (lists are not copied)."""
        fields_set = self.__pydantic_fields_set__
        values = self.__dict__
        out = {name: _json(values[name]) for name in type(self).model_fields if name in fields_set}
        if self.__pydantic_extra__:
            out.update(self.__pydantic_extra__)
        return out

    def extra(self, key: str, default: Any = None) -> Any:
        """A key this model does not declare (a newer writer's), or ``default``."""
        return (self.__pydantic_extra__ or {}).get(key, default)


class PolicyRef(_Format):
    """Which policy produced the record: the served model id (the model the batch called) and
    the policy version; written only when the batch was given a load mode
    (``legato_pipelines.policy.loading``): ``load`` (``none`` | ``lora`` | ``weights`` |
    ``external``), ``checkpoint`` (the version's folder) and ``fingerprint``
    (``sha256:<hex>`` of its file sizes and config/index files); ``cache_salt`` (written when
    sent): the ``cache_salt`` every request of the batch carried, derived from the
    fingerprint, so that the server's prefix cache never served KV of other weights."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"load", "checkpoint", "fingerprint", "cache_salt"}
    )

    model: str | None = None
    version: str | None = None
    load: str | None = None
    checkpoint: str | None = None
    fingerprint: str | None = None
    cache_salt: str | None = None


class Timing(_Format):
    """Seconds per phase of one execution; ``total_s`` includes ``queue_s``.

    ``reset_critical_s`` (written when measured): seconds the attempt waited for its desktop
    on the critical path, from the moment its runner asked for one (the end of the runner's
    previous attempt, or its start) to the hand-out of a desktop reset, set up and ready for
    it; ``reset_ahead``: the desktop was prepared ahead, its reset, setup and ready wait all
    ended before the runner asked (a spare's work, docs/architecture.md §3); false when the
    runner waited for any part of the reset (always with no spares). ``reset_s`` stays the
    reset's own seconds, wherever it ran.
    """

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"reset_critical_s", "reset_ahead"})

    queue_s: Seconds = Field(0.0, description="Seconds queued before a desktop took it.")
    reset_s: Seconds = Field(0.0, description="Seconds resetting the desktop, waits included.")
    policy_s: Seconds = Field(0.0, description="Seconds in model calls.")
    act_s: Seconds = Field(0.0, description="Seconds executing actions.")
    wait_s: Seconds = Field(0.0, description="Seconds waiting for the screen after actions.")
    obs_s: Seconds = Field(0.0, description="Seconds taking and preparing screenshots.")
    eval_s: Seconds = Field(0.0, description="Seconds grading.")
    total_s: Seconds = Field(0.0, description="Seconds from enqueue to the end (queue_s included).")
    reset_critical_s: Seconds | None = Field(
        None, description="Seconds the attempt waited for a ready desktop after asking."
    )
    reset_ahead: bool | None = Field(
        None,
        description="The desktop was ready (reset, set up) before the attempt's runner asked.",
    )

    @property
    def attempt_s(self) -> float:
        """The attempt's own seconds: ``total_s`` without ``queue_s`` (reset, steps, grading),
        which does not grow with the attempt's place in the collection order."""
        return max(0.0, self.total_s - self.queue_s)

    def phase(self, phase: str) -> float:
        """Seconds of ``phase`` (one of :data:`PHASES`, without ``_s``), 0 when absent."""
        value = getattr(self, f"{phase}_s", None)
        return 0.0 if value is None else value


class SetupFailure(_Format):
    """A setup step that failed the way OSWorld logs and carries on after: its index and type,
    the exit status (``execute``; a ``launch`` that died at once) and the stderr tail or the
    desktop's message (at most 500 characters)."""

    step: int | None = None
    type: str | None = None
    exit_status: int | None = None
    error: str | None = None


class UnexpectedWindow(_Format):
    """A window that appeared on the desktop after the reset's windows were recorded (the
    task's setup done and the screen ready) and before the policy's first action: nobody
    asked for it (an "updates available" dialog), so the desktop closed it. ``title`` and
    ``wm_class`` (the X class) name it; ``when`` it was found: ``handout`` (before the first
    screenshot went to the policy) or ``first_action`` (before the policy's first action ran);
    ``outcome``: ``closed`` (asked to close), ``killed`` (its X client killed), ``gone``."""

    title: str | None = None
    wm_class: str | None = None
    when: str | None = None
    outcome: str | None = None


class Reset(_Format):
    """How the desktop was reset (``fast`` | ``revert``) and the wait after it [s];
    ``timed_out``: the ready wait hit its cap; ``setup_failures`` (written only when there were
    any): what OSWorld carried on after. Facts of the desktop, never the policy's doing, each
    written only when there were any: ``keyboard_restored`` (the reset found the keyboard
    layout changed by an earlier attempt and restored the desktop's own, e.g.
    ``"layout de -> us"``) and ``unexpected_windows`` (:class:`UnexpectedWindow`);
    ``undrawn`` (written only when true): the ready wait ended with an app's window still blank
    or the app still loading, so step 0's observation shows it undrawn."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"timed_out", "setup_failures", "keyboard_restored", "unexpected_windows", "undrawn"}
    )

    kind: str | None = None
    ready_s: Seconds | None = None
    wait_s: Seconds | None = None
    timed_out: bool | None = None
    setup_failures: list[SetupFailure] | None = None
    keyboard_restored: str | None = None
    unexpected_windows: list[UnexpectedWindow] | None = None
    undrawn: bool | None = None


class ErrorInfo(_Format):
    """Why an execution failed: ``kind`` ``policy`` | ``request`` | ``config`` | ``env``
    (:data:`POLICY`, :data:`REQUEST`, :data:`CONFIG`, :data:`ENV`); ``type`` (the exception class, or
    the desktop error kind); ``phase`` where it happened; ``attempts`` (policy errors only):
    HTTP requests made for the failed call."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"attempts"})

    kind: str | None = None
    type: str | None = None
    message: str | None = None
    phase: str | None = None
    attempts: int | None = None


class StepResponse(_Format):
    """What the model produced at one step: text, reasoning, token ids, logprobs (one per
    token), token strings (only when there are no ids), finish reason; ``tool_calls`` (written
    only when the server sent some: its tool-call parser took the call out of the text) as the
    server sent them."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"tool_calls"})

    content: str | None = None
    reasoning: str | None = None
    token_ids: TokenIds = None
    logprobs: Logprobs = None
    tokens: Tokens = None
    finish_reason: str | None = None
    tool_calls: Annotated[list[dict[str, Any]] | None, SkipValidation] = None


class ModelCall(_Format):
    """The model call's numbers: tokens (``cached_tokens`` ``None``: not reported), seconds
    (re-tries included), HTTP attempts, requests cut at step_timeout, where ids came from;
    ``system_fingerprint`` (written only when the server sent one): the response's own word on
    which weights answered."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"system_fingerprint"})

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    seconds: Seconds = 0.0
    attempts: int = 1
    timeouts: int = 0
    token_ids_source: str | None = None
    notes: list[str] = Field(default_factory=list)
    system_fingerprint: str | None = None


class ActionRecord(_Format):
    """One executed action of a step: the structured action (as
    :meth:`legato_pipelines.actions.Action.to_record` gives it) and its act / wait / ready
    seconds (``ready_s`` ``None`` with the fixed-wait baseline) and ``timed_out`` (the ready
    wait hit its cap; absent in records written before it was recorded); ``not_typed``
    (written only when set): the characters of a ``type`` that did not reach the desktop;
    ``undrawn`` (written only when true): the ready wait ended with a launched app's window
    still blank, so the next step's observation shows it undrawn. Keys a newer writer adds are
    kept."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"screen", "text", "keys", "pixels", "seconds", "status", "clamped"}
        | {"act_s", "wait_s", "ready_s", "timed_out", "not_typed", "undrawn"}
    )

    action: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    screen: list[int | float] | None = None
    text: str | None = None
    keys: list[str] | None = None
    pixels: int | float | None = None
    seconds: Seconds | None = None
    status: str | None = None
    clamped: bool | None = None
    act_s: Seconds | None = None
    wait_s: Seconds | None = None
    ready_s: Seconds | None = None
    timed_out: bool | None = None
    not_typed: str | None = None
    undrawn: bool | None = None


class Step(_Format):
    """One policy call and what followed: ``request`` (message hashes: the exact prompt),
    ``response``, ``model`` (call numbers), the parsed ``action_text`` / ``parse_error``, the
    executed ``actions``, ``obs_s`` [s] to take the screenshot, ``observation`` (its image sha);
    ``prompt_ids`` (written only when the server returned the prompt's token ids): those ids,
    encoded against the previous step's (:func:`encode_prompt_ids`). Written only when they
    apply (issue 31): ``seed``, the request's own sampling seed (``PolicyConfig.request_seed``;
    absent: no seed sent); ``answer_field``, where the parsed answer was read when it was not
    ``content`` (``reasoning``: a reasoning parser took it all; ``tool_calls`` /
    ``content+tool_calls``: a tool-call parser took the call out of the text; ``None``: empty);
    ``truncated``, why the output was cut (``max_tokens``: it reached ``max_tokens``;
    ``context_length``: the server shortened it to fit its context, HTTP 200 with
    ``finish_reason: length``, which ends the attempt as ``truncated``)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"prompt_ids", "seed", "answer_field", "truncated"}
    )

    step: int
    request: list[str] = Field(default_factory=list)
    response: StepResponse = Field(default_factory=StepResponse)
    model: ModelCall = Field(default_factory=ModelCall)
    action_text: str | None = None
    parse_error: str | None = None
    actions: list[ActionRecord] = Field(default_factory=list)
    obs_s: Seconds | None = None
    observation: str | None = None
    prompt_ids: Annotated[dict[str, Any] | None, SkipValidation] = None
    seed: int | None = None
    answer_field: str | None = None
    truncated: str | None = None


class Record(_Format):
    """One execution of one logical attempt (``task_id``, ``group_id``, ``attempt``);
    ``rollout_id`` names the execution, ``execution`` counts re-tries (0 first);
    ``truncation`` (written only when set): why a ``truncated`` attempt stopped early other
    than ``rollout_timeout`` (the server's context-length message, with the fix);
    ``collected_by`` (written only when the collection was given one) names the session that
    collected it, e.g. the Dagster run id, so a resumed run keeps each attempt's own;
    ``eval_notes`` (written only when there were any): facts about what the evaluator
    compared that explain the reward without changing it, each ``"<kind>: <text>"`` (e.g.
    ``uncached_formulas``: an xlsx whose formulas hold no cached values);
    ``postconfig_failures`` (written only when there were any): the steps between the
    policy's end and the grade (the evaluator's ``postconfig``) that failed the way OSWorld
    carries on after: a command exiting non-zero, an ``activate_window`` / ``close_window``
    that found no window (:class:`SetupFailure`); ``grader_log`` (written only when the grader
    is a process of its own, OSWorld's code): the path, relative to the run directory, of
    what that process wrote for this execution (``grader-logs/<rollout_id>.log``)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"truncation", "collected_by", "eval_notes", "postconfig_failures", "grader_log"}
    )

    format: str = FORMAT
    rollout_id: str
    task_id: str
    domain: str | None = None
    group_id: str | None = None
    attempt: int
    execution: int = 0
    policy: PolicyRef = Field(default_factory=PolicyRef)
    task_set: str | None = None
    status: Status | None = None
    outcome: str | None = None
    reward: Number | None = None
    error: ErrorInfo | None = None
    eval_error: str | None = None
    n_steps: int = 0
    desktop: str | None = None
    started_at: Seconds | None = None
    ended_at: Seconds | None = None
    timing: Timing = Field(default_factory=Timing)
    reset: Reset | None = None
    steps: list[Step] = Field(default_factory=list)
    truncation: str | None = None
    collected_by: str | None = None
    eval_notes: list[str] | None = None
    postconfig_failures: list[SetupFailure] | None = None
    grader_log: str | None = None

    @property
    def reward_valid(self) -> bool:
        """The record carries a valid reward (:func:`valid_reward`)."""
        return valid_reward(self.reward)

    @property
    def final(self) -> bool:
        """Counts for training (status ``ok`` or ``truncated``)."""
        return is_final(self.status)

    @property
    def logical_attempt(self) -> tuple[str, int]:
        """(``task_id``, ``attempt``): the logical attempt this execution belongs to."""
        return (self.task_id, self.attempt)

    @property
    def error_kind(self) -> str | None:
        """``policy`` | ``request`` | ``config`` | ``env`` when the execution failed, else
        ``None``."""
        return self.error.kind if self.error is not None else None

    @property
    def env_failure(self) -> bool:
        """The desktop failed during this execution (status ``retried`` or ``error``)."""
        return self.error_kind == ENV


def valid_reward(value: Any) -> bool:
    """Whether ``value`` is a reward a trainer may use: a finite number (not ``None``, NaN,
    +-inf, a bool or a string). An evaluator that gives anything else has failed."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


RUN_MIN = 8
"""Shortest run of one repeated id that :func:`encode_prompt_ids` writes as ``[id, count]``."""


def encode_prompt_ids(previous: list[int] | None, ids: list[int]) -> dict[str, Any]:
    """A step's prompt token ids, stored near their unique bytes: ``{"prefix": n, "tail": [...]}``
    where ``n`` ids are shared with ``previous`` (the same attempt's previous prompt; ``None``
    for the first step) and ``tail`` holds the rest, each run of at least :data:`RUN_MIN` equal
    ids (an image's placeholder tokens) written as a two-element list ``[id, count]``.
    Consecutive prompts of an attempt share everything up to the newest turn, so a step
    stores only its new tokens. :func:`decode_prompt_ids` inverts it."""
    prefix = 0
    if previous:
        limit = min(len(previous), len(ids))
        if ids[:limit] == previous[:limit]:  # the usual case (the prompt grew), compared in C
            prefix = limit
        else:  # binary search on slice equality: O(n log n) in C, not a Python loop per id
            lo, hi = 0, limit  # ids[:lo] == previous[:lo]; ids[:hi] != previous[:hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if ids[:mid] == previous[:mid]:
                    lo = mid
                else:
                    hi = mid
            prefix = lo if ids[:hi] != previous[:hi] else hi
    tail: list[Any] = []
    i, n = prefix, len(ids)
    while i < n:
        j = i + 1
        while j < n and ids[j] == ids[i]:
            j += 1
        if j - i >= RUN_MIN:
            tail.append([ids[i], j - i])
        else:
            tail.extend(ids[i:j])
        i = j
    return {"prefix": prefix, "tail": tail}


def decode_prompt_ids(previous: list[int] | None, encoded: Mapping[str, Any]) -> list[int]:
    """The prompt token ids of a step from :func:`encode_prompt_ids`'s form and the previous
    step's ids. Raises ``ValueError`` when ``prefix`` is longer than ``previous``."""
    prefix = int(encoded.get("prefix") or 0)
    if prefix > len(previous or ()):
        raise ValueError(f"prompt_ids: prefix {prefix} longer than the previous prompt")
    out = list((previous or [])[:prefix])
    for item in encoded.get("tail") or ():
        if isinstance(item, list):
            out.extend([item[0]] * item[1])
        else:
            out.append(item)
    return out


def as_record(record: Record | Mapping[str, Any]) -> Record:
    """``record`` typed: a :class:`Record` as is, a JSON dict through :meth:`Record.from_json_dict`."""
    return record if isinstance(record, Record) else Record.from_json_dict(record)


def as_records(records: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
    """Every record typed (see :func:`as_record`)."""
    return [as_record(r) for r in records]
