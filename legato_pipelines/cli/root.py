"""The root ``legato`` Typer app every command module registers its commands on."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

app = typer.Typer(
    rich_markup_mode=None,  # help texts hold units in brackets ([s], [tokens]): not markup
    name="legato",
    help="Rollout collection for computer-use RL: desktops x policy server -> graded trajectories.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals could hold the policy key
    add_completion=False,
)


def _version(value: bool) -> None:
    """``legato --version``: the installed distribution's version, then exit 0."""
    if value:
        try:
            typer.echo(f"legato-pipelines {version('legato-pipelines')}")
        except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
            typer.echo("legato-pipelines (not installed: a source checkout)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Rollout collection for computer-use RL: desktops x policy server -> graded trajectories."""
