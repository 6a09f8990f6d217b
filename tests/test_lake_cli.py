"""``legato lake query`` / ``legato lake views`` on a synthetic lake (real Parquet, real DuckDB)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.lake_tables import Lineage, profile_table, rollouts_table
from tests.lake_synthetic import write_run_dir


def _lake(tmp_path) -> tuple[Lake, dict]:
    lake = Lake(tmp_path / "lake")
    run = write_run_dir(tmp_path / "run", version="step-5")
    lineage = Lineage("step-5", "t", "r")
    lake.write("rollouts", "step-5", rollouts_table(run["records"], lineage))
    lake.write("profile", "step-5", profile_table(run["summary"], lineage))
    lake.refresh_views()
    return lake, run


def test_query_prints_rows_as_json_and_table(tmp_path):
    lake, run = _lake(tmp_path)
    runner = CliRunner()
    out = runner.invoke(
        app,
        [
            "lake",
            "query",
            "SELECT status, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1",
            "--lake",
            str(lake.root),
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    expected = {}
    for r in run["records"]:
        expected[r["status"]] = expected.get(r["status"], 0) + 1
    assert {r["status"]: r["n"] for r in rows} == expected
    out = runner.invoke(
        app, ["lake", "query", "SELECT success_rate FROM profile", "--lake", str(lake.root)]
    )
    assert out.exit_code == 0 and str(round(run["summary"]["success_rate"], 3))[:4] in out.output


def test_bad_sql_and_missing_lake_are_clear_errors(tmp_path):
    lake, _ = _lake(tmp_path)
    runner = CliRunner()
    out = runner.invoke(
        app, ["lake", "query", "SELECT nope FROM rollouts", "--lake", str(lake.root)]
    )
    assert out.exit_code == 2 and "nope" in " ".join(out.output.split())
    out = runner.invoke(app, ["lake", "query", "SELECT 1", "--lake", str(tmp_path / "empty")])
    assert out.exit_code == 2 and "does not exist yet" in " ".join(
        out.output.split()
    )  # rich may wrap
    out = runner.invoke(app, ["lake", "views", "--lake", str(lake.root)])
    assert out.exit_code == 0 and "step-5" in out.output and "legato.duckdb" in out.output


def test_the_default_lake_is_the_one_legato_demo_writes_not_the_current_directory(
    tmp_path, monkeypatch
):
    from legato_pipelines.cli.demo import default_lake

    home = tmp_path / "instance"
    lake = Lake(home / "lake")
    lineage = Lineage("step-5", "t", "r")
    run = write_run_dir(tmp_path / "run", version="step-5")
    lake.write("rollouts", "step-5", rollouts_table(run["records"], lineage))
    lake.refresh_views()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("LEGATO_LAKE", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert default_lake() == lake.root  # the demo's lake: <instance>/lake
    runner = CliRunner()
    out = runner.invoke(app, ["lake", "query", "SELECT count(*) AS n FROM rollouts", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"n": len(run["records"])}
    out = runner.invoke(app, ["lake", "views"])
    assert out.exit_code == 0 and f"lake:   {lake.root}" in out.output
    assert not (elsewhere / "lake").exists()
    monkeypatch.setenv("LEGATO_LAKE", str(tmp_path / "other"))  # the variable still wins
    out = runner.invoke(app, ["lake", "views"])
    assert f"lake:   {tmp_path / 'other'}" in out.output
    help_text = " ".join(runner.invoke(app, ["lake", "query", "--help"]).output.split())
    assert "$LEGATO_LAKE, else the lake legato demo writes" in help_text


def test_a_folder_with_an_invalid_key_breaks_no_other_versions_view(tmp_path):
    # A lake written before keys were checked: policy_version=step-5_lr=3e-6 (DuckDB's hive
    # partitioning reads two keys there and refused every table's view, all versions).
    import pyarrow.parquet as pq

    lake, run = _lake(tmp_path)
    bad = lake.root / "rollouts" / "policy_version=step-5_lr=3e-6"
    bad.mkdir()
    table = lake.read("rollouts", "step-5")
    column = table.schema.get_field_index("policy_version")
    table = table.set_column(column, "policy_version", [["step-5_lr=3e-6"] * table.num_rows])
    pq.write_table(table, bad / "part-0.parquet")
    assert lake.versions("rollouts") == ["step-5"]  # not a version: left out
    lake.refresh_views()
    out = CliRunner().invoke(
        app,
        [
            "lake",
            "query",
            "SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1",
            "--lake",
            str(lake.root),
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    n = len(run["records"])
    assert rows == [
        {"policy_version": "step-5", "n": n},
        {"policy_version": "step-5_lr=3e-6", "n": n},
    ]
    views = CliRunner().invoke(app, ["lake", "views", "--lake", str(lake.root)])
    assert views.exit_code == 0 and "step-5" in views.output
