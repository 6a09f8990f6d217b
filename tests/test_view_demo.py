"""``legato demo`` falls back to fake desktops, saying why, only where real ones cannot start
(issue 17); the run on real desktops is tests/test_dagster_definitions.py's demo test."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.cli.demo import real_desktops_unavailable
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.rundir import read_meta


def _without(monkeypatch, missing: str) -> None:
    which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == missing else which(name, *a, **k)
    )


def test_no_real_desktops_without_xvfb(monkeypatch):
    _without(monkeypatch, "Xvfb")
    assert real_desktops_unavailable() == "Xvfb not installed (scripts/setup.sh installs them)"


@pytest.mark.slow
def test_demo_falls_back_to_fake_desktops_and_says_why(monkeypatch, tmp_path):
    _without(monkeypatch, "soffice")
    for name in ("LEGATO_TASKS", "LEGATO_LAKE", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    out = CliRunner().invoke(
        app,
        ["demo", "--home", str(home), "--version", "step-3", "--group", "2", "--max-steps", "3"],
    )
    text = " ".join(out.output.split())
    assert out.exit_code == 0, out.output
    assert "real desktops cannot start here: soffice not installed" in text
    assert "using fake desktops instead" in text and "fake desktops: 4" in text
    lake = Lake(home / "lake")
    assert read_meta(lake.run_dir("step-3"))["knobs"]["backend"] == "fake"
    report = lake.run_dir("step-3") / "report" / "index.html"
    assert report.is_file() and "rollout report (fake desktops):" in text


@pytest.mark.slow
def test_demo_shows_the_steps_own_error_not_the_traceback(monkeypatch, tmp_path):
    """A second demo of the same version with other settings fails in the rollout_batch step
    (ResumeError): the demo prints that error's message (what to change), not the traceback
    tail ending at ``raise ResumeError(``."""
    for name in ("LEGATO_TASKS", "LEGATO_LAKE", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"task_id": "t1", "config": {"instruction": "x", "fake": {}}}]))
    args = ["demo", "--backend", "fake", "--home", str(tmp_path / "home"), "--tasks", str(tasks)]
    args += ["--version", "step-7", "--group", "1", "--desktops", "1"]
    first = CliRunner().invoke(app, [*args, "--max-steps", "2"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, [*args, "--max-steps", "3"])
    text = " ".join(again.output.split())
    assert again.exit_code == 1
    assert "error: out: " in text and "holds a run of max_steps 2, not 3" in text
    assert "fix: --max-steps 2" in text and "full log:" in text
    assert "raise ResumeError(" not in text and "Stack Trace" not in text
