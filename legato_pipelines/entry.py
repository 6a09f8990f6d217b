"""The ``legato`` command's entry point (``python -m legato_pipelines`` too).

Before the CLI is imported (typer, rich, pydantic, the engine: ~1.2 s on a loaded 2-core
machine), :func:`.desktops.early.start` starts the templates a local batch forks its desktops
and graders from, so their imports run beside the CLI's (issue 18).
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run ``legato`` with ``sys.argv``; see :func:`legato_pipelines.cli.main`.

    Ctrl-C before the CLI is imported (its first ~1 s) exits 130 with one line, not a
    traceback from inside an import; templates started early are stopped at exit."""
    try:
        from .desktops.early import start

        start(sys.argv[1:])
        from .cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted before the command started; nothing was collected\n")
        raise SystemExit(130) from None
    cli_main()
