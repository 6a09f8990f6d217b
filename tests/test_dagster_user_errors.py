"""User mistakes around the Dagster layer are one clear line naming the setting and the fix:
``legato demo``'s inputs (checked before any Dagster run), the code location's environment,
the checkpoint sensor without a source."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from tests.conftest import fake_tasks


def _demo(tmp_path, *args: str):
    out = CliRunner().invoke(app, ["demo", "--home", str(tmp_path / "home"), *args])
    text = " ".join(out.output.split())  # rich may wrap
    return out, text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--version", "bad/ver sion"], "--version: policy_version 'bad/ver sion'"),
        (
            ["--group", "0"],
            "group: attempts per task must be an integer >= 1, got 0 (fix: --group)",
        ),
        (["--max-steps", "0"], "(fix: --max-steps)"),
        (["--desktops", "0"], "(fix: --desktops)"),
    ],
)
def test_demo_refuses_bad_flags_before_dagster_starts(tmp_path, args, needle):
    out, text = _demo(tmp_path, *args)
    assert out.exit_code == 2, out.output
    assert text.startswith("error: ") and needle in text
    assert "Traceback" not in out.output and "dagster asset materialize" not in text
    assert not (tmp_path / "home").exists()  # nothing started, no instance made


def test_demo_refuses_a_broken_task_file_with_the_engine_message(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(2))[:-1] + ",]")  # a trailing comma
    out, text = _demo(tmp_path, "--tasks", str(tasks))
    assert out.exit_code == 2, out.output
    assert f"tasks: '{tasks}' is not valid JSON (trailing comma" in text
    assert not (tmp_path / "home").exists()
    out, text = _demo(tmp_path, "--tasks", str(tmp_path / "nope.json"))
    assert out.exit_code == 2 and "(fix: pass --tasks PATH or set LEGATO_TASKS)" in text
