"""Task lists: load, resolve and validate them before any desktop starts.

A task list is a JSON list whose entries are either
  ``{"task_id": ..., "domain": ...}``   an OSWorld task, resolved under ``--osworld DIR`` at
                                        ``evaluation_examples/examples/<domain>/<task_id>.json``
                                        (a directory laid out like ``tests/data/osworld`` with
                                        ``<domain>/<task_id>.json`` works too), or
  ``{"task_id": ..., "config": {...}}`` an inline config in OSWorld's task format
                                        (``instruction``, ``config`` setup steps, ``evaluator``).
An OSWorld index file (``test_all.json``: ``{domain: [task ids]}``) is accepted too.

The task set id is a hash of the canonical resolved configs (sorted keys, in list order), so
the same tasks always give the same id. Every entry is checked first, all of them: the shapes
are pydantic models (:class:`TaskEntry`, :class:`TaskConfig`), whose ``ValidationError`` holds
every problem of the list at once, and :class:`~legato_pipelines.errors.TaskListError` lists
them all, each naming its entry (index, task_id, the OSWorld file it came from) and field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .errors import TaskListError


@dataclass(frozen=True, slots=True)
class Task:
    """One resolved task.

    ``config`` is the whole OSWorld-format task config (``instruction``, ``config``,
    ``evaluator``, ...). ``domain`` is ``None`` for inline tasks without one.
    """

    task_id: str
    domain: str | None
    config: dict[str, Any]
    source: str  # "osworld:<path>" or "inline"

    @property
    def instruction(self) -> str:
        return self.config["instruction"]

    @property
    def setup(self) -> list[dict[str, Any]]:
        """The task's setup steps (OSWorld ``config``), possibly empty."""
        return list(self.config.get("config") or [])

    @property
    def evaluator(self) -> dict[str, Any]:
        return self.config.get("evaluator") or {}


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A task attempt's grade: ``reward`` in [0, 1] and, when the evaluator raised, its
    reason (reward 0). What ``Desktop.evaluate`` and the OSWorld-format evaluators return.
    ``notes``: facts about what was compared that explain the grade without changing it,
    each ``"<kind>: <text>"`` (e.g. ``uncached_formulas: ...``), recorded as ``eval_notes``.
    ``postconfig_failures``: the evaluator's postconfig steps that failed the way OSWorld
    carries on after (a command exiting non-zero, a window step matching no window), each
    ``{step, type, exit_status, error}``, recorded as ``postconfig_failures``."""

    reward: float
    error: str | None = None
    notes: tuple[str, ...] = ()
    postconfig_failures: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class TaskSet:
    """The resolved tasks of one list and their id (``task_set``, 16 hex digits)."""

    tasks: tuple[Task, ...]
    task_set: str
    path: str | None = None

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        return iter(self.tasks)


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no whitespace): the input of every content hash."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def task_set_id(tasks: list[Task] | tuple[Task, ...]) -> str:
    """Hash (SHA-256, first 16 hex digits) of the canonical resolved configs, in list order."""
    h = hashlib.sha256()
    for task in tasks:
        h.update(
            canonical_json({"task_id": task.task_id, "domain": task.domain, "config": task.config})
        )
        h.update(b"\n")
    return h.hexdigest()[:16]


def load_tasks(source: str | Path | list, *, osworld: str | Path | None = None) -> TaskSet:
    """Load and validate a task list (a path to JSON, or an already-parsed list / index dict).

    An OSWorld index (``{domain: [ids]}``) is resolved under ``osworld``; without it, under
    the index's own directory when its tasks sit there as ``<domain>/<id>.json``.

    Raises :class:`TaskListError` for a missing file, bad JSON, or invalid entries; nothing
    is started before the whole list has been checked. Every problem of the list is found
    at once: the error's ``problems`` lists them all (one line each, ``tasks[i] (task_id
    'x'[, file PATH]): field 'config.instruction' ...``), its message the first 20; its
    ``tasks`` holds the entries that were valid all the same, with their index.
    """
    path: str | None = None
    if isinstance(source, (str, Path)):
        path = str(source)
        data = _read_json(
            Path(source),
            f"tasks: {path!r}",
            missing=f"tasks: file {path!r} does not exist (fix: pass --tasks PATH to a JSON task list)",
        )
    else:
        data = source
    index_dir: Path | None = None
    if isinstance(data, dict):
        data = _index_to_entries(data, path)
        index_dir = Path(path).parent if path is not None else None
    if not isinstance(data, list) or not data:
        raise TaskListError(
            f"tasks: {path or 'the task list'} must be a non-empty JSON list of "
            '{"task_id", "domain"} or {"task_id", "config"} entries, or an OSWorld index {domain: [ids]}'
        )
    root = Path(osworld) if osworld is not None else _index_root(index_dir, data)
    problems: list[tuple[int, str]] = []  # (entry index, problem)
    bad: set[int] = set()
    try:
        _ENTRIES.validate_python(data)
    except ValidationError as exc:
        for error in exc.errors():
            index, *loc = error["loc"]
            bad.add(index)
            problems.append((index, f"{_where(index, data[index])}: {_problem(error, loc)}"))
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(data):
        if index in bad:
            continue
        try:
            task = _resolve(index, entry, root)
        except TaskListError as exc:
            problems += [(index, problem) for problem in exc.problems]
            continue
        if task.task_id in seen:
            problems.append(
                (
                    index,
                    f"{_where(index, entry)}: field 'task_id' repeats entry {seen[task.task_id]}; "
                    "each task appears once (use --group for more attempts)",
                )
            )
            continue
        seen[task.task_id] = index
        tasks.append(task)
    if problems:
        problems.sort(key=lambda found: found[0])  # entry order; an entry's own as found
        raise TaskListError.listing(
            [problem for _, problem in problems],
            f"the task list {path}" if path else "the task list",
            tasks=[(seen[t.task_id], t) for t in tasks],  # the valid entries all the same
        )
    return TaskSet(tuple(tasks), task_set_id(tasks), path)


def _where(index: int, entry: Any, path: Path | None = None) -> str:
    """``tasks[i]``, with the entry's task_id when it has a usable one, and the OSWorld file
    its config came from (``path``)."""
    task_id = entry.get("task_id") if isinstance(entry, dict) else None
    named = [f"task_id {task_id!r}"] if isinstance(task_id, str) and task_id else []
    if path is not None:
        named.append(f"file {path}")
    return f"tasks[{index}] ({', '.join(named)})" if named else f"tasks[{index}]"


def _problem(error: Any, loc: list) -> str:
    """One pydantic error as ``field 'a.b[0].c' <message>`` (or the message, for the entry)."""
    field = ""
    for part in loc:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    message = error["msg"]
    if error["type"] == "missing":
        message = "is missing"
    elif error["type"] == "extra_forbidden":
        message = "is not a field here"
    return f"field {field!r} {message}" if field else message


# Keys of one task entry or task config: an object with them is not an OSWorld index.
TASK_ENTRY_KEYS = frozenset({"task_id", "instruction", "evaluator"})


def _index_to_entries(index: dict, path: str | None) -> list[dict]:
    if TASK_ENTRY_KEYS & set(index):
        raise TaskListError(
            f"tasks: {path or 'the task list'} is a single JSON object that looks like one task "
            f"(keys {', '.join(sorted(TASK_ENTRY_KEYS & set(index)))}); it must be a list of task "
            "entries, or an OSWorld index {domain: [ids]} (fix: wrap the entry in [...])"
        )
    entries = []
    for domain, ids in index.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise TaskListError(
                f"tasks: index {path or ''} domain {domain!r} must map to a list of task id strings"
            )
        entries.extend({"task_id": task_id, "domain": domain} for task_id in ids)
    return entries


def _index_root(index_dir: Path | None, entries: list) -> Path | None:
    """The directory of an OSWorld index read without ``--osworld`` when its tasks sit next to
    it as ``<domain>/<id>.json`` (the first entry's file decides), else ``None``."""
    if index_dir is None or not entries:
        return None
    first = entries[0]
    if (index_dir / str(first.get("domain")) / f"{first.get('task_id')}.json").is_file():
        return index_dir
    return None


def osworld_task_path(root: Path, domain: str, task_id: str) -> Path:
    """Where OSWorld keeps a task config: ``evaluation_examples/examples/<domain>/<id>.json``.

    A directory that is itself the ``examples`` folder (``<root>/<domain>/<id>.json``) works too.
    """
    nested = root / "evaluation_examples" / "examples" / domain / f"{task_id}.json"
    if nested.exists():
        return nested
    flat = root / domain / f"{task_id}.json"
    return flat if flat.exists() else nested


def _resolve(index: int, entry: dict, root: Path | None) -> Task:
    """The task of a valid entry (:class:`TaskEntry`): inline, or read from its OSWorld file.
    Raises :class:`TaskListError` listing the problems of an OSWorld file's config."""
    task_id, domain = entry["task_id"], entry.get("domain")
    where = _where(index, entry)
    if entry.get("config") is not None:
        return Task(task_id=task_id, domain=domain, config=entry["config"], source="inline")
    if root is None:
        raise TaskListError(
            f"{where}: an OSWorld task needs --osworld DIR (an OSWorld checkout) to resolve it"
        )
    path = osworld_task_path(root, domain, task_id)
    config = _read_json(
        path,
        f"{where}: {path}",
        missing=f"{where}: field 'domain': no task config at {path} (check --osworld and the domain)",
    )
    try:
        _CONFIG.validate_python(config)
    except ValidationError as exc:
        where = _where(index, entry, path)
        raise TaskListError.listing(
            [f"{where}: {_problem(e, ['config', *e['loc']])}" for e in exc.errors()], str(path)
        ) from None
    return Task(task_id=task_id, domain=domain, config=config, source=f"osworld:{path}")


# --- the shapes, as pydantic models: every problem of a list is reported at once ---------


def _fails(message: str) -> PydanticCustomError:
    """A validation error whose text is ``message`` as written (no "Value error," prefix)."""
    return PydanticCustomError("task_list", message)


def _check(test: Callable[[Any], bool], message: str) -> AfterValidator:
    """A validator keeping a value for which ``test`` holds, else failing with ``message``."""

    def validate(value: Any) -> Any:
        if not test(value):
            raise _fails(message)
        return value

    return AfterValidator(validate)


def _an_object(message: str) -> BeforeValidator:
    """Checks a value is a JSON object (``None`` passes: optional fields)."""

    def validate(value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise _fails(message)
        return value

    return BeforeValidator(validate)


def _a_list(message: str) -> BeforeValidator:
    def validate(value: Any) -> Any:
        if not isinstance(value, list):
            raise _fails(message)
        return value

    return BeforeValidator(validate)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _probability(value: Any) -> Any:
    # the comparison also rejects NaN
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise PydanticCustomError(
            "task_list",
            "must be a probability (a number in [0, 1]), got {got} (fix: e.g. 0.5)",
            {"got": repr(value)},
        )
    return value


def _metric_names(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(f, str) for f in value)
    )


class _Open(BaseModel):
    """Validated, never converted: fields not named here are OSWorld's and pass through."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)


class SetupStep(_Open):
    """One OSWorld setup step: ``{"type": str, "parameters": {...}}``."""

    type: Annotated[
        Any, _check(lambda v: isinstance(v, str), "must be a string (a setup step type)")
    ]
    parameters: Annotated[Any, _an_object("must be an object")] = None


class Evaluator(_Open):
    """An OSWorld evaluator: ``func`` a metric name or a list of them (the rest is checked
    per backend by ``osworld_format.preflight``)."""

    func: Annotated[Any, _check(_metric_names, "must be a metric name or a list of them")]


class FakeBlock(_Open):
    """The fake backend's block: ``success`` the probability of reward 1 (default 0.5)."""

    success: Annotated[Any, AfterValidator(_probability)] = 0.5


_Fake = Annotated[
    FakeBlock | None, _an_object('must be an object {"success": P} (fix: e.g. {"success": 0.5})')
]


class TaskConfig(_Open):
    """A task config in OSWorld's format: ``instruction``, setup steps ``config``, ``evaluator``,
    and the fake backend's optional ``fake`` block."""

    instruction: Annotated[Any, _check(_text, "must be a non-empty string")]
    config: Annotated[
        list[Annotated[SetupStep, _an_object("must be an object (a setup step)")]],
        _a_list("(setup steps) must be a list"),
    ] = []
    evaluator: Annotated[Evaluator | None, _an_object("must be an object")] = None
    fake: _Fake = None


class TaskEntry(_Open):
    """One entry of a task list: ``task_id`` and ``domain`` (an OSWorld task) or ``config``
    (an inline :class:`TaskConfig`)."""

    task_id: Annotated[Any, _check(_text, "must be a non-empty string")]
    domain: Annotated[
        Any, _check(lambda v: v is None or isinstance(v, str), "must be a string")
    ] = None
    config: Annotated[
        TaskConfig | None, _an_object("must be an object in OSWorld's task format")
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _an_entry(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise _fails(
                "must be an object with 'task_id' and 'domain' or 'config', "
                f"got {type(value).__name__}"
            )
        return value

    @model_validator(mode="after")
    def _osworld_or_inline(self) -> TaskEntry:
        if self.config is None and self.domain is None:
            raise _fails(
                "needs field 'domain' (an OSWorld task) or field 'config' (an inline task)"
            )
        return self


_ENTRIES = TypeAdapter(list[TaskEntry])
_CONFIG = TypeAdapter(TaskConfig)
_FAKE = TypeAdapter(_Fake)


def fake_config_problem(config: dict[str, Any]) -> str | None:
    """Why ``config["fake"]`` is invalid for the fake backend, or ``None`` when it is fine.

    ``fake`` is optional; when given it is an object whose ``success`` (default 0.5) is the
    probability of reward 1, a number in [0, 1] (see :mod:`legato_pipelines.desktops.backends.fake`).
    The message starts ``field 'config.fake...'``.
    """
    try:
        _FAKE.validate_python(config.get("fake"))
    except ValidationError as exc:
        error = exc.errors()[0]
        return _problem(error, ["config", "fake", *error["loc"]])
    return None


def _read_json(path: Path, shown: str, *, missing: str) -> Any:
    """The JSON in the file at ``path``; ``TaskListError(missing)`` when there is no such file,
    ``"<shown> is not valid JSON (...)"`` when it does not parse."""
    if not path.is_file():
        raise TaskListError(missing)
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TaskListError(f"{shown} is not valid JSON ({exc})") from None
