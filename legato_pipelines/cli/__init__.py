"""The ``legato`` command line (also ``python -m legato_pipelines``).

Each group of commands lives in its own module and registers itself on :data:`app`.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="legato",
    help="Rollout collection for computer-use RL: desktops x policy server -> graded trajectories.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals could hold the policy key
    add_completion=False,
)

# Command modules (each adds its commands to ``app`` on import).
from . import collect as _collect  # noqa: E402,F401
from . import demo as _demo  # noqa: E402,F401
from . import desktop as _desktop  # noqa: E402,F401
from . import lake as _lake  # noqa: E402,F401
from . import osworld as _osworld  # noqa: E402,F401
from . import policy as _policy  # noqa: E402,F401
from . import tasks as _tasks  # noqa: E402,F401
from . import view as _view  # noqa: E402,F401


def main() -> None:
    """Entry point of the ``legato`` console script."""
    app()
