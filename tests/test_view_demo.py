"""``legato demo`` falls back to fake desktops, saying why, only where real ones cannot start
(issue 17); the run on real desktops is tests/test_dagster_definitions.py's demo test."""

from __future__ import annotations

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
