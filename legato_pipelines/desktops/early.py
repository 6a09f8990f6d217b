"""The local desktops' templates, started on ``legato collect``'s first line (issue 18).

A local batch forks its desktop servers from one template process (``server/template.py``:
~0.6 s of imports) and OSWorld's graders from another (``osworld_worker/template.py``: desktop_env,
~1.3 s of imports). The batch's warm-up starts both, but only once the command has imported
its CLI and the engine (~1.2 s on one core of two, the other idle), so the graders' template
was the start-up's critical path: the first desktops opened ~3.5 s after the launch.

:func:`start`, called by the ``legato`` entry point before anything heavy is imported, reads
the command line and, for ``collect --backend local``, starts those templates at once with the
command line and whole environment the warm-up would give them (the backend's early hook,
:data:`.registry.EARLY`, ``backends/local_early.py``; the functions that build them are the
warm-up's own: :func:`.server.template.template_command`,
:func:`.osworld_worker.template.preloading_command`). The warm-up then takes them over
(:func:`.processes.take_early`: same command line, same environment, still running) instead
of starting its own. A template nobody takes is stopped: once the warm-up has taken its own
(a flag read differently here), or at exit (a policy check that failed, a run with nothing
left to do); until then it costs its imports' CPU and its memory.

Best effort by design: anything unexpected here leaves the command as it was (the warm-up
starts its templates itself). Stdlib and the project's light modules only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Sequence

from .processes import early_processes, spawn_early
from .registry import DEFAULT_BACKEND, early_hook

log = logging.getLogger(__name__)


def start(argv: Sequence[str]) -> None:
    """Start the templates ``legato`` with arguments ``argv`` (``sys.argv[1:]``) will fork its
    local desktops and graders from: for ``collect --backend local`` (``--backend=local``),
    the desktop server template unless desktops are attached by URL (option ``urls``), and the
    OSWorld graders' template unless option ``grader=own`` or no OSWorld interpreter is found
    (``--osworld-python``, option ``osworld_python``, else the default venv). Nothing for any
    other command, for ``--help``, or when the command line cannot be read. Never raises.

    When it started one, and for any ``collect``, SIGTERM and SIGHUP (unless ignored or
    handled already) end ``legato`` through ``SystemExit`` with a line saying so from now on,
    so its exit handlers stop the templates even when the signal comes during the CLI's
    imports (``legato collect`` turns SIGTERM into
    Ctrl-C during a batch, and puts this back after)."""
    try:
        for argv_, env, own_dir in _templates_for(list(argv)):
            spawn_early(argv_, env, own_dir=own_dir)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the warm-up starts its own
        log.debug("no template started early: %s", exc)
    if early_processes() or list(argv[:1]) == ["collect"]:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _exit_on_signal)


def _exit_on_signal(signum: int, frame: object) -> None:
    """Say so on stderr (the CLI's own handlers do, later), then exit 128 + ``signum``."""
    with contextlib.suppress(OSError, ValueError):
        name = signal.Signals(signum).name
        os.write(2, f"legato: stopped by {name} (run the same command again to resume)\n".encode())
    raise SystemExit(128 + signum)


def _templates_for(argv: list[str]) -> list[tuple[list[str], dict[str, str], bool]]:
    """``(command line, environment, whether it runs in a directory of its own)`` of each
    template to start."""
    if not argv or argv[0] != "collect" or "--help" in argv:
        return []
    flags = _flags(argv[1:])
    backend = (flags.get("--backend") or [DEFAULT_BACKEND])[-1].strip().lower()
    hook = early_hook(backend)
    if hook is None:
        return []
    from .option_flags import parse_desktop_options

    options = parse_desktop_options(flags.get("--desktop-option", []))
    if flags.get("--osworld-python"):
        options["osworld_python"] = flags["--osworld-python"][-1]
    return hook(options)


def _flags(args: list[str]) -> dict[str, list[str]]:
    """The values of the long options this module reads, ``--name value`` or
    ``--name=value``, in order."""
    wanted = ("--backend", "--desktop-option", "--osworld-python")
    values: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        if name in wanted:
            if not sep:
                i += 1
                if i >= len(args):
                    break
                value = args[i]
            values.setdefault(name, []).append(value)
        i += 1
    return values
