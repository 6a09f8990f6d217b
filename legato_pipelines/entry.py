"""The ``legato`` command's entry point (``python -m legato_pipelines`` too).

Before the CLI is imported (typer, rich, pydantic, the engine: ~1.2 s on a loaded 2-core
machine), :func:`.desktops.early.start` starts the templates a local batch forks its desktops
and graders from, so their imports run beside the CLI's (issue 18).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def main() -> None:
    """Run ``legato`` with ``sys.argv``; see :func:`legato_pipelines.cli.main`.

    Ctrl-C before the command runs exits 130 with one line, not a traceback: while the CLI
    is imported (its first ~1 s), and while typer builds the command from the functions'
    signatures (``inspect`` evaluating annotations, ~0.1 s, outside typer's own Ctrl-C
    handling, which exits 130 silently once the command is parsed). Templates started early
    are stopped at exit."""
    try:
        from .desktops.early import start

        start(sys.argv[1:])
        from .cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted before the command started; nothing was collected\n")
        _exit(130)


def _exit(code: int) -> NoReturn:
    """Exit with ``code`` after the exit handlers (they stop the early templates).

    Not ``SystemExit``: in CPython 3.11 a Ctrl-C that lands inside code run by ``exec`` or
    ``eval`` of a string (dataclasses and typer's annotations do both while the CLI starts)
    marks the interrupt unhandled for good, even once caught, and the interpreter then ends
    by killing itself with SIGINT (exit status -2) whatever ``SystemExit`` said."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
