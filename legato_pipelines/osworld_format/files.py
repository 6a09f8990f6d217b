"""The files a task references by URL: every ``download`` step's files and ``cloud_file`` getter.

One scanner for everything that asks "which files does this task need?": :mod:`.classify`
(``legato tasks check``: which URLs need the internet) and ``legato osworld cache`` (fetch them
into the file cache). Setup steps and the evaluator's ``postconfig`` steps are both scanned;
a ``cloud_file`` getter with ``multi`` gives one file per entry of its parallel ``path`` /
``dest`` lists. Where a file lives locally is :mod:`.sources`' business, not this module's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..tasks import Task
from .evaluate import evaluator_parts

FileKind = Literal["download", "cloud_file"]


@dataclass(frozen=True, slots=True)
class TaskFile:
    """One file a task references.

    ``url``: where its bytes come from (a ``file://`` URL, a local path or a web URL);
    ``dest``: the path or file name the task gives it (``download``: the path on the desktop;
    ``cloud_file``: OSWorld's cache file name), ``None`` when the task gives none; ``kind``: the
    step or getter type; ``field``: where in the task config it is, e.g.
    ``config.config[0].parameters.files[1]`` or ``config.evaluator.expected[1].path[2]``.
    """

    url: str
    dest: str | None
    kind: FileKind
    field: str


def evaluator_getters(evaluator: dict) -> list[dict]:
    """The evaluator's ``result`` and ``expected`` getter configs, in order (none when the
    evaluator is malformed: no ``func`` or parallel lists of different lengths)."""
    return [getter for _, getter in _evaluator_getters_at(evaluator)]


def _evaluator_getters_at(evaluator: dict) -> list[tuple[str, dict]]:
    try:
        parts = evaluator_parts(evaluator) if evaluator.get("func") else []
    except ValueError:
        parts = []
    listed = isinstance(evaluator.get("func"), list)
    out = []
    for i, (_, result, expected, _) in enumerate(parts):
        at = f"[{i}]" if listed else ""
        for side, getter in (("result", result), ("expected", expected)):
            if getter:
                out.append((f"config.evaluator.{side}{at}", getter))
    return out


def _download_files(steps: Any, field: str) -> list[TaskFile]:
    out: list[TaskFile] = []
    if not isinstance(steps, list):
        return out
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or step.get("type") != "download":
            continue
        files = (step.get("parameters") or {}).get("files")
        if not isinstance(files, list):
            continue
        for j, file in enumerate(files):
            if isinstance(file, dict) and file.get("url"):
                dest = file.get("path")
                out.append(
                    TaskFile(
                        url=str(file["url"]),
                        dest=str(dest) if dest else None,
                        kind="download",
                        field=f"{field}[{i}].parameters.files[{j}]",
                    )
                )
    return out


def _cloud_files(getter: dict, field: str) -> list[TaskFile]:
    multi = bool(getter.get("multi"))
    paths, dests = getter.get("path"), getter.get("dest")
    if not multi:
        return (
            [TaskFile(str(paths), str(dests) if dests else None, "cloud_file", f"{field}.path")]
            if paths
            else []
        )
    paths = paths if isinstance(paths, list) else [paths]
    dests = dests if isinstance(dests, list) else [dests] * len(paths)
    return [
        TaskFile(str(url), str(dest) if dest else None, "cloud_file", f"{field}.path[{k}]")
        for k, (url, dest) in enumerate(zip(paths, dests, strict=False))
        if url
    ]


def task_files(task: Task) -> list[TaskFile]:
    """Every file ``task`` references by URL, in config order: the ``download`` steps of its
    setup (``config.config``) and of the evaluator's ``postconfig``, then its ``cloud_file``
    getters (``multi`` lists expanded). Repeats are kept (one entry per reference).

    Static: reads the config only, never the disk or the network; malformed parts (a ``files``
    that is not a list, a file without ``url``) are skipped, as :mod:`.problems` reports them.
    """
    evaluator = task.evaluator
    out = _download_files(task.config.get("config") or [], "config.config")
    out += _download_files(evaluator.get("postconfig") or [], "config.evaluator.postconfig")
    for field, getter in _evaluator_getters_at(evaluator):
        if isinstance(getter, dict) and getter.get("type") == "cloud_file":
            out += _cloud_files(getter, field)
    return out


def cache_file_paths(task: Task) -> list[str]:
    """The ``path`` of every ``cache_file`` getter of ``task``'s evaluator (OSWorld's
    ``get_cache_file``: a file relative to the task's cache directory), in config order."""
    return [
        str(getter["path"])
        for _, getter in _evaluator_getters_at(task.evaluator)
        if isinstance(getter, dict) and getter.get("type") == "cache_file" and getter.get("path")
    ]
