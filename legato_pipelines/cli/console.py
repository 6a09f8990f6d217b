"""The terminal every ``legato`` command writes to (rich), and how a command fails.

``soft_wrap``: plain lines are not wrapped at the terminal width, so paths and URLs stay
whole and copyable (tables still fit the width).
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with ``code`` (2: bad input), without a
    traceback: messages name the field and the fix. ``message`` is printed literally."""
    err.print(f"[bold red]error:[/] {escape(str(message))}", highlight=False)
    raise typer.Exit(code)
