"""The ``legato`` command's entry point (``python -m legato_pipelines`` too).

Before the CLI is imported (typer, rich, pydantic, the engine: ~1.2 s on a loaded 2-core
machine), :func:`.desktops.early.start` starts the templates a local batch forks its desktops
and graders from, so their imports run beside the CLI's (issue 18).
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run ``legato`` with ``sys.argv``; see :func:`legato_pipelines.cli.main`."""
    from .desktops.early import start

    start(sys.argv[1:])
    from .cli import main as cli_main

    cli_main()
