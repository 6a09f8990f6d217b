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
the same tasks always give the same id. Every entry is checked first; a bad one raises
:class:`~legato_pipelines.errors.TaskListError` naming its index, task_id and field.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

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
    each ``"<kind>: <text>"`` (e.g. ``uncached_formulas: ...``), recorded as ``eval_notes``."""

    reward: float
    error: str | None = None
    notes: tuple[str, ...] = ()


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

    Raises :class:`TaskListError` for a missing file, bad JSON, or any invalid entry; nothing
    is started before the whole list has been checked.
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
    if isinstance(data, dict):
        data = _index_to_entries(data, path)
    if not isinstance(data, list) or not data:
        raise TaskListError(
            f"tasks: {path or 'the task list'} must be a non-empty JSON list of "
            '{"task_id", "domain"} or {"task_id", "config"} entries, or an OSWorld index {domain: [ids]}'
        )
    root = Path(osworld) if osworld is not None else None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(data):
        task = _resolve(index, entry, root)
        if task.task_id in seen:
            raise TaskListError(
                f"tasks[{index}] (task_id {task.task_id!r}): field 'task_id' repeats entry {seen[task.task_id]}; "
                "each task appears once (use --group for more attempts)"
            )
        seen[task.task_id] = index
        tasks.append(task)
    return TaskSet(tuple(tasks), task_set_id(tasks), path)


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


def osworld_task_path(root: Path, domain: str, task_id: str) -> Path:
    """Where OSWorld keeps a task config: ``evaluation_examples/examples/<domain>/<id>.json``.

    A directory that is itself the ``examples`` folder (``<root>/<domain>/<id>.json``) works too.
    """
    nested = root / "evaluation_examples" / "examples" / domain / f"{task_id}.json"
    if nested.exists():
        return nested
    flat = root / domain / f"{task_id}.json"
    return flat if flat.exists() else nested


def _resolve(index: int, entry: Any, root: Path | None) -> Task:
    where = f"tasks[{index}]"
    if not isinstance(entry, dict):
        raise TaskListError(
            f"{where}: must be an object with 'task_id' and 'domain' or 'config', got {type(entry).__name__}"
        )
    task_id = entry.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise TaskListError(f"{where}: field 'task_id' must be a non-empty string")
    where = f"tasks[{index}] (task_id {task_id!r})"
    domain = entry.get("domain")
    if domain is not None and not isinstance(domain, str):
        raise TaskListError(f"{where}: field 'domain' must be a string")
    if "config" in entry:
        config = entry["config"]
        source = "inline"
        if not isinstance(config, dict):
            raise TaskListError(
                f"{where}: field 'config' must be an object in OSWorld's task format"
            )
    else:
        if domain is None:
            raise TaskListError(
                f"{where}: needs field 'domain' (an OSWorld task) or field 'config' (an inline task)"
            )
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
        source = f"osworld:{path}"
    _validate_config(where, config)
    return Task(task_id=task_id, domain=domain, config=config, source=source)


def fake_config_problem(config: dict[str, Any]) -> str | None:
    """Why ``config["fake"]`` is invalid for the fake backend, or ``None`` when it is fine.

    ``fake`` is optional; when given it is an object whose ``success`` (default 0.5) is the
    probability of reward 1, a number in [0, 1] (see :mod:`legato_pipelines.desktops.fake`).
    """
    fake = config.get("fake")
    if fake is None:
        return None
    if not isinstance(fake, dict):
        return 'field \'config.fake\' must be an object {"success": P} (fix: e.g. {"success": 0.5})'
    success = fake.get("success", 0.5)
    if (
        isinstance(success, bool)
        or not isinstance(success, int | float)
        or not 0.0 <= success <= 1.0  # also rejects NaN
    ):
        return (
            "field 'config.fake.success' must be a probability (a number in [0, 1]), "
            f"got {success!r} (fix: e.g. 0.5)"
        )
    return None


def _validate_config(where: str, config: dict) -> None:
    instruction = config.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskListError(f"{where}: field 'config.instruction' must be a non-empty string")
    setup = config.get("config", [])
    if not isinstance(setup, list):
        raise TaskListError(f"{where}: field 'config.config' (setup steps) must be a list")
    for i, step in enumerate(setup):
        if not isinstance(step, dict) or not isinstance(step.get("type"), str):
            raise TaskListError(
                f"{where}: field 'config.config[{i}].type' must be a string (a setup step type)"
            )
        if not isinstance(step.get("parameters", {}), dict):
            raise TaskListError(f"{where}: field 'config.config[{i}].parameters' must be an object")
    evaluator = config.get("evaluator")
    if evaluator is not None:
        if not isinstance(evaluator, dict):
            raise TaskListError(f"{where}: field 'config.evaluator' must be an object")
        func = evaluator.get("func")
        if not (
            isinstance(func, str)
            or (isinstance(func, list) and func and all(isinstance(f, str) for f in func))
        ):
            raise TaskListError(
                f"{where}: field 'config.evaluator.func' must be a metric name or a list of them"
            )
    if (problem := fake_config_problem(config)) is not None:
        raise TaskListError(f"{where}: {problem}")


def _read_json(path: Path, shown: str, *, missing: str) -> Any:
    """The JSON in the file at ``path``; ``TaskListError(missing)`` when there is no such file,
    ``"<shown> is not valid JSON (...)"`` when it does not parse."""
    if not path.is_file():
        raise TaskListError(missing)
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TaskListError(f"{shown} is not valid JSON ({exc})") from None
