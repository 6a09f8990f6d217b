"""The Parquet lake and its DuckDB views, on synthetic run directories (real files, real DuckDB)."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from legato_pipelines.errors import ConfigError
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.lake_tables import (
    PROFILE_SCHEMA,
    ROLLOUTS_SCHEMA,
    STEPS_SCHEMA,
    Lineage,
    profile_table,
    rollouts_table,
    samples_table,
    steps_table,
)
from legato_pipelines.versions import check_version_key
from tests.lake_synthetic import write_run_dir


def _fill(lake: Lake, tmp: Path, version: str, seed: int = 0) -> dict:
    run = write_run_dir(tmp / f"run-{version}", version=version, seed=seed)
    lineage = Lineage(version, run["summary"]["task_set"], f"run-{version}")
    lake.write("rollouts", version, rollouts_table(run["records"], lineage))
    lake.write("steps", version, steps_table(run["records"], lineage))
    lake.write("profile", version, profile_table(run["summary"], lineage))
    return run


def test_tables_follow_records_with_lineage(tmp_path):
    run = write_run_dir(tmp_path / "run", version="step-3")
    lineage = Lineage("step-3", "0123456789abcdef", "dagster-run-1")
    rollouts = rollouts_table(run["records"], lineage)
    steps = steps_table(run["records"], lineage)
    assert rollouts.schema == ROLLOUTS_SCHEMA and steps.schema == STEPS_SCHEMA
    assert rollouts.num_rows == len(run["records"])
    assert steps.num_rows == sum(len(r["steps"]) for r in run["records"])
    for table in (rollouts, steps):
        assert set(table.column("policy_version").to_pylist()) == {"step-3"}
        assert set(table.column("run_id").to_pylist()) == {"dagster-run-1"}
        assert set(table.column("rollout_id").to_pylist()) <= {
            r["rollout_id"] for r in run["records"]
        }
    rows = rollouts.to_pylist()
    assert [r["status"] for r in rows] == [r["status"] for r in run["records"]]
    error = next(r for r in rows if r["status"] == "error")
    assert error["error_kind"] == "policy" and error["error_type"] == "PolicyTimeout"
    first = run["records"][0]
    assert rows[0]["started_at"].timestamp() == pytest.approx(first["started_at"])
    assert rows[0]["prompt_tokens"] == sum(s["model"]["prompt_tokens"] for s in first["steps"])
    step = steps.to_pylist()[0]
    assert json.loads(step["actions"])[0]["action"] == "click"
    assert step["wait_s"] == pytest.approx(0.2) and step["has_logprobs"] is True


def test_profile_row_and_schema_stable_when_values_missing(tmp_path):
    run = write_run_dir(tmp_path / "run")
    lineage = Lineage("step-1", "0123456789abcdef", "r")
    row = profile_table(run["summary"], lineage).to_pylist()[0]
    assert row["count_ok"] == run["summary"]["counts"]["ok"] and row["count_skipped"] == 0
    assert dict(row["time_share"]) == pytest.approx(run["summary"]["time_share"])
    assert json.loads(row["summary"])["records"] == run["summary"]["records"]
    empty = profile_table({}, lineage)
    assert empty.schema == PROFILE_SCHEMA and empty.column("success_rate").null_count == 1


def test_samples_get_run_id_and_refuse_another_version():
    export = pa.table(
        {
            "rollout_id": ["a", "b"],
            "step": [0, 1],
            "policy_version": ["v1", "v1"],
            "task_set": ["t", "t"],
        }
    )
    out = samples_table(export, Lineage("v1", "t", "run-9"))
    assert out.column("run_id").to_pylist() == ["run-9", "run-9"]
    with pytest.raises(ValueError, match="policy_version"):
        samples_table(export, Lineage("v2", "t", "run-9"))


def test_partition_keys_are_checked(tmp_path):
    assert check_version_key("step-7") == "step-7"
    for bad in ("", "a/b", "a...b", "..", "x\ny", "step-5_lr=3e-6"):
        with pytest.raises(ConfigError, match="version key"):
            check_version_key(bad)
    lake = Lake(tmp_path)
    assert lake.run_dir("step-7") == tmp_path.resolve() / "runs" / "policy_version=step-7"
    with pytest.raises(ConfigError, match="unknown table"):
        lake.partition_dir("nope", "v")


def test_write_is_atomic_and_views_answer_sql(tmp_path):
    lake = Lake(tmp_path / "lake")
    run7 = _fill(lake, tmp_path, "7")  # a numeric-looking key stays a string
    run8 = _fill(lake, tmp_path, "step-8", seed=1)
    leftovers = [p for p in lake.root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    assert lake.versions("rollouts") == ["7", "step-8"]
    with pytest.raises(ValueError, match="other versions"):
        lake.write("rollouts", "7", lake.read("rollouts", "step-8"))
    views = lake.refresh_views()
    assert set(views) == {"rollouts", "steps", "profile", "time_share"}
    n7 = (
        lake.query("SELECT count(*) AS n FROM rollouts WHERE policy_version = '7'")
        .column("n")[0]
        .as_py()
    )
    assert n7 == len(run7["records"])
    by_version = lake.query(
        "SELECT policy_version, avg(reward) AS success FROM rollouts WHERE status = 'ok' GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    for row, run in zip(by_version, (run7, run8), strict=True):
        ok = [r["reward"] for r in run["records"] if r["status"] == "ok"]
        assert row["success"] == pytest.approx(sum(ok) / len(ok))
    shares = lake.query(
        "SELECT phase, share FROM time_share WHERE policy_version = 'step-8'"
    ).to_pylist()
    assert {r["phase"]: r["share"] for r in shares} == pytest.approx(run8["summary"]["time_share"])
    assert (
        lake.query("SELECT typeof(policy_version) AS t FROM steps LIMIT 1").column("t")[0].as_py()
        == "VARCHAR"
    )


def test_readers_are_read_only_and_see_new_partitions_without_rebuild(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, tmp_path, "a")
    lake.refresh_views()
    con = lake.connect()
    try:
        with pytest.raises(duckdb.Error):
            con.execute("CREATE TABLE x AS SELECT 1")
        _fill(lake, tmp_path, "b")
        assert con.execute("SELECT count(DISTINCT policy_version) FROM rollouts").fetchone()[0] == 2
        lake.refresh_views()  # replacing the file under an open reader is fine
        assert con.execute("SELECT count(*) FROM profile").fetchone()[0] == 2
    finally:
        con.close()


def test_trainers_read_partitions_with_pyarrow_and_pandas(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, tmp_path, "a")
    run_b = _fill(lake, tmp_path, "b")
    dataset = ds.dataset(lake.root / "steps", format="parquet", partitioning="hive")
    only_b = dataset.to_table(filter=ds.field("policy_version") == "b")
    assert only_b.num_rows == sum(len(r["steps"]) for r in run_b["records"])
    import pandas as pd

    frame = pd.read_parquet(lake.partition_dir("steps", "b"))
    assert len(frame) == only_b.num_rows and set(frame["policy_version"]) == {"b"}


def test_charts_live_outside_the_tables_and_old_ones_move_out(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, tmp_path, "a")
    chart = lake.write_chart("a", "time_share.png", b"\x89PNG not really")
    assert chart == lake.root / "charts" / "policy_version=a" / "time_share.png"
    # a lake written before charts had their own folder: a PNG in a profile partition
    old = lake.partition_dir("profile", "a") / "success_by_task.png"
    old.write_bytes(b"\x89PNG old")
    with pytest.raises(pa.ArrowInvalid, match="magic bytes"):
        ds.dataset(lake.root / "profile", format="parquet", partitioning="hive").to_table()
    _fill(lake, tmp_path, "a")  # re-materializing the partition moves it out
    assert not old.exists()
    assert (lake.chart_dir("a") / "success_by_task.png").read_bytes() == b"\x89PNG old"
    assert ds.dataset(lake.root / "profile", format="parquet", partitioning="hive").count_rows()
    with pytest.raises(ValueError, match="non-Parquet"):
        lake.write_chart("a", "x.parquet", b"")


def _writer(root: str, version: str, rounds: int) -> None:
    lake = Lake(root)
    table = pa.table({"x": list(range(100)), "policy_version": [version] * 100})
    for _ in range(rounds):
        lake.write("samples", version, table)
        lake.refresh_views()


@pytest.mark.slow
def test_concurrent_partitions_never_collide_on_duckdb(tmp_path):
    lake = Lake(tmp_path / "lake")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(lake.root), f"v{i}", 15)) for i in range(4)]
    for p in procs:
        p.start()
    errors = []
    while any(p.is_alive() for p in procs):
        if lake.duckdb_path.exists():
            try:
                lake.query("SELECT count(*) FROM samples")
            except duckdb.CatalogException:
                pass  # a view not created yet by the first writer
            except Exception as exc:  # a torn file or a lock error would land here
                errors.append(exc)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert errors == []
    assert lake.query("SELECT count(*) AS n FROM samples").column("n")[0].as_py() == 400
    assert not list(lake.root.glob(".legato.duckdb.*.tmp*"))
