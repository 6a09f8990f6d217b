"""Run OSWorld-format setup steps (a task's ``config``, an evaluator's ``postconfig``) on a desktop.

Semantics follow OSWorld's ``SetupController`` (``desktop_env/controllers/setup.py``): steps run
in order, each ``{"type": T, "parameters": {...}}`` maps to one desktop server call, commands get
the placeholders of :mod:`.placeholders`, and a command that exits non-zero still counts as done
(``pkill chrome`` when Chrome is not running is normal in postconfig). Differences, on purpose:

- nothing is downloaded: ``download`` reads ``file://`` URLs or the local file cache
  (:mod:`.sources`); anything else raises :class:`UnsupportedStep` before any step runs;
- step types without a local implementation (``chrome_open_tabs``, ``googledrive``, ``login``,
  ...) raise :class:`UnsupportedStep` before any step runs, instead of failing half-way;
- an ``execute`` with ``until`` polls at most ``UNTIL_TIMEOUT_S`` seconds (OSWorld has no bound);
- what OSWorld logs and carries on after is a *fact* here, returned by :func:`run_setup` and
  kept on the attempt's record (``reset.setup_failures``; an evaluator's postconfig:
  ``postconfig_failures``): an ``execute``/``command`` that exits non-zero, a ``launch`` the
  desktop refuses or whose process dies at once, an ``open`` of a missing file, a window step
  the desktop refuses. Each fact is ``{step, type, exit_status, error}`` (``error``: the
  stderr tail or the server's message, at most :data:`FAILURE_TAIL_CHARS` characters);
- a window step that matches no window (``activate_window`` / ``close_window``: the project's
  servers say so in :data:`~.controller.WINDOW_FOUND_HEADER`; OSWorld's say nothing) is a fact
  with ``window_misses`` (the postconfig's: a document not saved because the window to save
  it in was not there explains a grade); in a task's setup it is not, as on OSWorld's VM, whose
  server answers 200 whatever ``wmctrl`` found;
- any other failed step raises :class:`~legato_pipelines.errors.DesktopError` ``kind="setup"``
  naming the step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DesktopError
from ..tasks import Task
from .controller import EXECUTE_TIMEOUT_S, DesktopController
from .placeholders import placeholder_values, substitute
from .sources import cache_dir_path, resolve_source
from .unsupported import UnsupportedStep

log = logging.getLogger(__name__)

UNTIL_TIMEOUT_S = 60.0  # cap on an ``execute`` step's ``until`` polling, seconds
UNTIL_POLL_S = 0.3  # OSWorld's poll interval for ``until``, seconds
UNTIL_MAX_FAILURES = 5  # failed requests tolerated while polling (OSWorld: 5)
FAILURE_TAIL_CHARS = 500  # the stderr / message tail kept in a setup failure fact

# Errors that mean the desktop itself is gone: passed through unchanged so the engine recovers it.
PASS_THROUGH_KINDS = frozenset({"transport", "timeout", "crash", "vm", "unsupported"})


@dataclass(frozen=True, slots=True)
class SetupContext:
    """What the steps of one ``run_setup`` call share.

    ``cache_dir`` is the read-only file cache for downloads; ``work_dir`` receives ``stdout`` /
    ``stderr`` captures of ``execute`` steps (read back by the ``cache_file`` getter), or ``None``
    to drop them; ``execute_timeout`` the seconds one ``execute`` command may run;
    ``window_misses``: a window step that matched no window is a failure fact (the
    postconfig's, module docstring).
    """

    controller: DesktopController
    task_id: str
    values: dict[str, str]
    cache_dir: Path | None
    work_dir: Path | None
    execute_timeout: float = EXECUTE_TIMEOUT_S
    window_misses: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)
    step: list[Any] = field(default_factory=lambda: [0, ""])  # [index, type] of the running step

    def fail(self, *, exit_status: int | None, error: str) -> None:
        """Record that the running step failed the way OSWorld carries on after."""
        index, step_type = self.step
        self.failures.append(
            {
                "step": index,
                "type": step_type,
                "exit_status": exit_status,
                "error": (error or "")[-FAILURE_TAIL_CHARS:],
            }
        )
        log.info("task %s setup step %s (%s) failed: %s", self.task_id, index, step_type, error)


Handler = Callable[[SetupContext, dict[str, Any]], Awaitable[None]]


async def run_setup(
    task: Task,
    controller: DesktopController,
    *,
    steps: list[dict] | None = None,
    cache_dir: Path | str | None = None,
    work_dir: Path | None = None,
    screen_size: tuple[int, int] = (1280, 720),
    client_password: str = "password",
    execute_timeout: float = EXECUTE_TIMEOUT_S,
    window_misses: bool = False,
) -> list[dict[str, Any]]:
    """Run ``task.setup`` (or ``steps``, e.g. an evaluator's postconfig) through ``controller``.

    ``screen_size`` (pixels) and ``client_password`` fill the command placeholders;
    ``execute_timeout`` bounds each ``execute`` command (seconds); ``window_misses``: a window
    step that matched no window is a fact too (the evaluator's postconfig). Every step
    is checked first: an unknown step type or a download URL that needs the internet raises
    :class:`UnsupportedStep` before anything runs. Then steps run in order; the first failure
    raises ``DesktopError(kind="setup")`` naming its index and type (transport failures of the
    controller pass through with their own kind). Returns the failures OSWorld carries on
    after, as facts (module docstring); empty when every step succeeded.
    """
    steps = task.setup if steps is None else list(steps)
    ctx = SetupContext(
        controller=controller,
        task_id=task.task_id,
        values=placeholder_values(client_password, screen_size),
        cache_dir=cache_dir_path(cache_dir),
        work_dir=Path(work_dir) if work_dir is not None else None,
        execute_timeout=execute_timeout,
        window_misses=window_misses,
    )
    _precheck(steps, ctx)
    for index, step in enumerate(steps):
        step_type = step.get("type")
        parameters = step.get("parameters") or {}
        where = f"task {task.task_id!r} setup step {index} ({step_type})"
        ctx.step[:] = [index, step_type]
        try:
            await HANDLERS[step_type](ctx, parameters)
        except DesktopError as exc:
            if exc.kind in PASS_THROUGH_KINDS:
                raise
            raise DesktopError(f"{where} failed: {exc}", kind="setup") from exc
        except Exception as exc:  # a step's own failure: name it
            raise DesktopError(
                f"{where} failed: {type(exc).__name__}: {exc}", kind="setup"
            ) from exc
    return ctx.failures


def _precheck(steps: list[dict], ctx: SetupContext) -> None:
    for index, step in enumerate(steps):
        step_type = step.get("type") if isinstance(step, dict) else None
        if step_type not in HANDLERS:
            raise UnsupportedStep(
                f"task {ctx.task_id!r} setup step {index}: type {step_type!r} is not supported here "
                f"(supported: {', '.join(sorted(HANDLERS))}); fix: run the task on the osworld backend",
                step_type=str(step_type),
            )
        if step_type == "download":
            for file in (step.get("parameters") or {}).get("files", []):
                try:
                    resolve_source(
                        file.get("url", ""),
                        dest=file.get("path"),
                        cache_dir=ctx.cache_dir,
                        task_id=ctx.task_id,
                        step_type="download",
                    )
                except FileNotFoundError as exc:
                    raise DesktopError(
                        f"task {ctx.task_id!r} setup step {index} (download): {exc}", kind="setup"
                    ) from exc


def _required(parameters: dict[str, Any], name: str, step_type: str) -> Any:
    value = parameters.get(name)
    if value in (None, "", []):
        raise DesktopError(f"{step_type}: parameter {name!r} is missing or empty", kind="setup")
    return value


async def _carry_on(ctx: SetupContext, call: Awaitable[Any]) -> Any:
    """Await a controller call and return its answer; a refusal by the desktop
    (``DesktopError`` kind ``setup``: the server answered, e.g. 404 or 500) becomes a failure
    fact, as OSWorld logs and carries on (``None`` is returned then)."""
    try:
        return await call
    except DesktopError as exc:
        if exc.kind != "setup":
            raise
        ctx.fail(exit_status=getattr(exc, "exit_status", None), error=str(exc))
        return None


async def _launch(ctx: SetupContext, p: dict[str, Any]) -> None:
    command = substitute(_required(p, "command", "launch"), ctx.values)
    await _carry_on(ctx, ctx.controller.launch(command, shell=bool(p.get("shell", False))))


async def _execute(ctx: SetupContext, p: dict[str, Any]) -> None:
    command = substitute(_required(p, "command", "execute"), ctx.values)
    shell = bool(p.get("shell", False))
    until: dict[str, Any] = p.get("until") or {}
    deadline = time.monotonic() + UNTIL_TIMEOUT_S
    failures = 0
    while True:
        result = await ctx.controller.execute(command, shell=shell, timeout=ctx.execute_timeout)
        if result.get("status") == "error":
            failures += 1
            if not until or failures >= UNTIL_MAX_FAILURES:
                raise DesktopError(
                    f"execute {command!r}: {result.get('message') or result.get('error') or 'server error'}",
                    kind="setup",
                )
        else:
            if result.get("returncode") not in (0, None) and not until:
                ctx.fail(exit_status=result.get("returncode"), error=result.get("error") or "")
            _capture(ctx, p.get("stdout"), result.get("output"))
            _capture(ctx, p.get("stderr"), result.get("error"))
            if not until or _until_met(until, result):
                return
        if time.monotonic() >= deadline:
            raise DesktopError(
                f"execute {command!r}: 'until' {until} not met within {UNTIL_TIMEOUT_S:.0f} s",
                kind="setup",
            )
        await asyncio.sleep(UNTIL_POLL_S)


def _until_met(until: dict[str, Any], result: dict[str, Any]) -> bool:
    return (
        ("returncode" in until and result.get("returncode") == until["returncode"])
        or ("stdout" in until and until["stdout"] in (result.get("output") or ""))
        or ("stderr" in until and until["stderr"] in (result.get("error") or ""))
    )


def _capture(ctx: SetupContext, name: str | None, text: str | None) -> None:
    if not name:
        return
    if ctx.work_dir is None:
        log.debug("setup capture %r dropped: no work_dir", name)
        return
    target = ctx.work_dir / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text or "")


async def _open(ctx: SetupContext, p: dict[str, Any]) -> None:
    path = substitute(_required(p, "path", "open"), ctx.values)
    await _carry_on(ctx, ctx.controller.open_file(path))


def _window_step(step_type: str) -> Handler:
    """``activate_window`` / ``close_window``: the controller method of the same name, with
    OSWorld's ``window_name``, ``strict`` and ``by_class``; a refusal is a fact, and so is no
    match when the server says so and ``ctx.window_misses`` (module docstring)."""

    async def handler(ctx: SetupContext, p: dict[str, Any]) -> None:
        name = _required(p, "window_name", step_type)
        strict, by_class = bool(p.get("strict", False)), bool(p.get("by_class", False))
        call = getattr(ctx.controller, step_type)(name, strict=strict, by_class=by_class)
        found = await _carry_on(ctx, call)
        if found is False and ctx.window_misses:
            ctx.fail(exit_status=None, error=no_window_message(name, strict, by_class))

    return handler


def no_window_message(name: str, strict: bool, by_class: bool) -> str:
    """The fact's ``error`` for a window step that matched no window (the same words as the
    osworld worker's, ``desktops/osworld_worker/setup_facts.py``)."""
    what = "class" if by_class else "title"
    how = "is" if strict else "contains"
    return f"no window whose {what} {how} {name!r}"


async def _sleep(ctx: SetupContext, p: dict[str, Any]) -> None:
    seconds = float(p.get("seconds", 0))
    if seconds < 0:
        raise DesktopError(f"sleep: parameter 'seconds' must be >= 0, got {seconds}", kind="setup")
    await asyncio.sleep(seconds)


async def _download(ctx: SetupContext, p: dict[str, Any]) -> None:
    files = _required(p, "files", "download")
    payloads = []
    for file in files:
        url, path = file.get("url"), file.get("path")
        if not url or not path:
            raise DesktopError(
                f"download: each file needs 'url' and 'path', got {file}", kind="setup"
            )
        source = resolve_source(
            url, dest=path, cache_dir=ctx.cache_dir, task_id=ctx.task_id, step_type="download"
        )
        payloads.append((path, source.read_bytes()))
    for path, data in payloads:
        await ctx.controller.upload(path, data)


async def _upload(ctx: SetupContext, p: dict[str, Any]) -> None:
    """``upload`` / ``upload_file``: files ``[{path, local_path}]`` or ``[{path, content}]`` (text)."""
    for file in _required(p, "files", "upload"):
        path = file.get("path")
        if not path:
            raise DesktopError(f"upload: each file needs 'path', got {file}", kind="setup")
        if "content" in file:
            data = str(file["content"]).encode()
        elif file.get("local_path"):
            data = Path(file["local_path"]).expanduser().read_bytes()
        else:
            raise DesktopError(
                f"upload: file {path!r} needs 'local_path' or 'content'", kind="setup"
            )
        await ctx.controller.upload(path, data)


HANDLERS: dict[str, Handler] = {
    "launch": _launch,
    "execute": _execute,
    "command": _execute,  # OSWorld: alias of execute
    "open": _open,
    "activate_window": _window_step("activate_window"),
    "close_window": _window_step("close_window"),
    "sleep": _sleep,
    "download": _download,
    "upload": _upload,
    "upload_file": _upload,  # OSWorld's name: files [{local_path, path}]
}

SUPPORTED_STEP_TYPES = frozenset(HANDLERS)
