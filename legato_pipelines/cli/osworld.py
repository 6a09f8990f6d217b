"""``legato osworld install``: the interpreter the ``osworld`` backend's workers run under."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .console import console
from .root import app

osworld_app = typer.Typer(
    help="OSWorld's DesktopEnv in its own venv (the osworld backend).", no_args_is_help=True
)
app.add_typer(osworld_app, name="osworld")


@osworld_app.command("install")
def install_command(
    venv: Annotated[
        Path | None,
        typer.Option(
            "--venv",
            help="Where to create the venv (default $LEGATO_OSWORLD_VENV or ~/.cache/legato/osworld-venv).",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Also the no-torch evaluator packages (documents, images, audio, PDF): ~1.4 GB.",
        ),
    ] = False,
) -> None:
    """Create a venv with desktop-env 1.0.2 (--no-deps) and the core (or --full) recipe.

    Prints the interpreter to pass as ``legato collect --backend osworld --osworld-python``.
    """
    from ..desktops.osworld.install import install

    with console.status("installing desktop-env into its own venv ..."):
        try:
            result = install(venv, full=full)
        except RuntimeError as exc:
            console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(1) from None
    console.print(
        f"osworld venv ready ({result['recipe']}, {result['size_mb']} MB, {result['seconds']} s): "
        f"--osworld-python {result['python']}",
        highlight=False,
    )
