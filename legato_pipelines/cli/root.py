"""The root ``legato`` Typer app every command module registers its commands on."""

from __future__ import annotations

import typer

app = typer.Typer(
    rich_markup_mode=None,  # help texts hold units in brackets ([s], [tokens]): not markup
    name="legato",
    help="Rollout collection for computer-use RL: desktops x policy server -> graded trajectories.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals could hold the policy key
    add_completion=False,
)
