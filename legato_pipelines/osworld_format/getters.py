"""Evaluator getters: fetch what a metric compares, with OSWorld's config keys and return shapes.

A getter is ``async (ctx, config) -> value`` where ``config`` is one ``result`` / ``expected``
entry of a task's evaluator (``{"type": T, ...}``); OSWorld names them ``get_<type>`` in
``desktop_env/evaluators/getters``. Supported here:

``vm_file``         ``path``, ``dest`` (+ ``multi``, ``gives``, ``time_suffix``): copies the desktop's
                    file into the evaluation's work directory; returns its local path, ``None``
                    for a missing file, or a list when ``gives`` selects several.
``vm_command_line`` ``command``, ``shell``: runs it on the desktop, returns its stdout.
``rule``            ``rules``: returns the rules object unchanged.
``cache_file``      ``path``: a file a setup/postconfig ``execute`` wrote with ``stdout``/``stderr``
                    (work directory), or one in the file cache; raises ``FileNotFoundError``.
``cloud_file``      ``path`` (URL), ``dest`` (+ ``multi``, ``gives``): the cached or ``file://`` copy
                    (see :mod:`.sources`); internet URLs raise :class:`UnsupportedStep`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from .controller import DesktopController
from .sources import resolve_source


@dataclass(frozen=True, slots=True)
class EvalContext:
    """What getters of one evaluation share: the desktop, the task id and two directories.

    ``work_dir`` is private to this evaluation (files fetched from the desktop, command
    captures); ``cache_dir`` is the shared read-only file cache (``None``: none); ``notes``
    collects facts about the compared files (:mod:`.file_notes`), recorded on the attempt.
    """

    controller: DesktopController
    task_id: str
    work_dir: Path
    cache_dir: Path | None
    notes: list[str] = field(default_factory=list)


Getter = Callable[[EvalContext, dict[str, Any]], Awaitable[Any]]


def _files(config: dict[str, Any]) -> tuple[list[str], list[str], set[int]]:
    """``(paths, dests, gives)`` of a single- or multi-file getter config (OSWorld's ``multi``)."""
    if config.get("multi", False):
        paths, dests = list(config["path"]), list(config["dest"])
    else:
        paths, dests = [config["path"]], [config["dest"]]
    return paths, dests, set(config.get("gives", [0]))


def _shape(selected: list[Any]) -> Any:
    """OSWorld's return shape: one selected file gives a value, several a list."""
    return selected[0] if len(selected) == 1 else selected


def _with_time_suffix(name: str, fmt: str) -> str:
    # OSWorld: insert the current time before the first "." of the name.
    if "." not in name:
        return name
    stem, ext = name.split(".", 1)
    return f"{stem}{datetime.now().strftime(fmt)}.{ext.split('.')[0]}"


async def vm_file(ctx: EvalContext, config: dict[str, Any]) -> str | None | list[str | None]:
    """Copy file(s) from the desktop into the work directory (OSWorld ``get_vm_file``)."""
    paths, dests, gives = _files(config)
    if not config.get("multi", False) and config.get("time_suffix", False):
        fmt = config.get("time_format", "%Y_%m_%d")
        paths = [_with_time_suffix(p, fmt) for p in paths]
        dests = [_with_time_suffix(d, fmt) for d in dests]
    selected: list[str | None] = []
    for index, (path, dest) in enumerate(zip(paths, dests, strict=False)):
        data = await ctx.controller.file(path)
        local = ctx.work_dir / PurePosixPath(dest).name
        if data is None:
            if index in gives:
                selected.append(None)
            continue
        local.write_bytes(data)
        if index in gives:
            selected.append(str(local))
    return _shape(selected)


async def vm_command_line(ctx: EvalContext, config: dict[str, Any]) -> str | None:
    """Run ``command`` on the desktop, return its stdout; ``None`` when the server could not run it."""
    result = await ctx.controller.execute(config["command"], shell=bool(config.get("shell", False)))
    if result.get("status") == "error":
        return None
    return result.get("output")


async def rule(ctx: EvalContext, config: dict[str, Any]) -> Any:
    """The ``rules`` object itself (OSWorld ``get_rule``)."""
    return config["rules"]


async def cache_file(ctx: EvalContext, config: dict[str, Any]) -> str:
    """A file in the work directory (captured command output) or in the file cache."""
    name = config["path"]
    candidates = [ctx.work_dir / name]
    if ctx.cache_dir is not None:
        candidates += [ctx.cache_dir / ctx.task_id / name, ctx.cache_dir / name]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"cache_file: {name!r} is neither in the work directory nor in the file cache"
    )


async def cloud_file(ctx: EvalContext, config: dict[str, Any]) -> str | list[str]:
    """The local copy of a reference file (OSWorld ``get_cloud_file``), never downloaded."""
    paths, dests, gives = _files(config)
    selected = []
    for index, (url, dest) in enumerate(zip(paths, dests, strict=False)):
        source = resolve_source(
            url, dest=dest, cache_dir=ctx.cache_dir, task_id=ctx.task_id, step_type="cloud_file"
        )
        if index in gives:
            selected.append(str(source))
    return _shape(selected)


GETTERS: dict[str, Getter] = {
    "vm_file": vm_file,
    "vm_command_line": vm_command_line,
    "rule": rule,
    "cache_file": cache_file,
    "cloud_file": cloud_file,
}
