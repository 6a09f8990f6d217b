"""The ``legato`` command's help shows its texts whole: units and defaults in brackets
(``[s]``, ``[tokens]``, ``[default: 2 real, 4 fake]``) are text, not Rich markup (a newcomer
read "Added latency per call ." and "Desktops at once .")."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["scripted-policy"], "Added latency per call [s]."),
        (["scripted-policy"], "Context [tokens]:"),
        (["scripted-policy"], "Prefix-cache block [tokens]"),
        (["demo"], "[default: 2 real, 4 fake]"),
    ],
)
def test_bracketed_units_and_defaults_survive_in_help(command, shown):
    out = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert shown in " ".join(out.output.split())


def test_version_names_the_installed_distribution():
    """``legato --version`` prints the installed distribution's version and runs no command."""
    from importlib.metadata import version

    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == f"legato-pipelines {version('legato-pipelines')}"
