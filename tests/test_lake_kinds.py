"""The lake's hard cases (issue 32 item 5): a lake written by two versions of the project, an
export of an incomplete batch, dropping a version, a ``legato.duckdb`` DuckDB 1.x must open,
and a ``legato.duckdb`` another process holds read-write. Real Parquet files, real DuckDB,
the real CLI."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.store import read_samples
from legato_pipelines.store.export import export_steps
from legato_pipelines.store.lake import PART_FILE, Lake
from legato_pipelines.store.lake_tables import Lineage, rollouts_table, samples_table
from tests.lake_synthetic import write_run_dir

OLD_COLUMNS = [  # the samples columns of a release from before quality, prompt ids and weights
    "rollout_id",
    "group_id",
    "task_id",
    "attempt",
    "step",
    "messages",
    "response_text",
    "response_reasoning",
    "response_token_ids",
    "response_logprobs",
    "response_tokens",
    "finish_reason",
    "reward",
    "advantage",
    "status",
    "policy_version",
    "task_set",
    "run_id",
    "collect_run_id",
]
NEWER = ("logprobs_valid", "parse_error", "prompt_token_ids", "load_proof", "group_complete")


def _samples(tmp_path: Path, version: str, *, group: int | None = None) -> pa.Table:
    run = tmp_path / f"run-{version}"
    write_run_dir(run, version=version, group=3)
    if group is not None:  # run.json as the engine writes it: the group size it collected for
        meta = orjson.loads((run / "run.json").read_bytes())
        meta["knobs"] = {"group": group, "oversample": 0.0}
        (run / "run.json").write_bytes(orjson.dumps(meta))
    lineage = Lineage(version, "0123456789abcdef", f"run-{version}", load_proof="none")
    return samples_table(export_steps(run), lineage)


def _old_lake(tmp_path: Path) -> Lake:
    """``step-1`` written by an older release (19 columns, as its file holds them), ``step-2``
    by today's (every column)."""
    lake = Lake(tmp_path / "lake")
    old = _samples(tmp_path, "step-1").select(OLD_COLUMNS)
    folder = lake.partition_dir("samples", "step-1")
    folder.mkdir(parents=True)
    pq.write_table(old, folder / PART_FILE)
    lake.write("samples", "step-2", _samples(tmp_path, "step-2"))
    lake.refresh_views()
    return lake


def test_readers_get_every_column_of_a_lake_written_by_two_releases(tmp_path):
    lake = _old_lake(tmp_path)
    # what the old snippet of the docs did: the first file's 19 columns only
    naive = ds.dataset(lake.root / "samples", format="parquet", partitioning="hive").schema
    assert not set(NEWER) & set(naive.names)

    table = read_samples(lake.root)
    assert set(NEWER) <= set(table.column_names)
    assert len(table.column_names) >= 36
    rows = table.select(["policy_version", "logprobs_valid", "load_proof"]).to_pylist()
    old = [r for r in rows if r["policy_version"] == "step-1"]
    new = [r for r in rows if r["policy_version"] == "step-2"]
    assert old and new
    assert all(r["logprobs_valid"] is None and r["load_proof"] is None for r in old)
    assert all(r["logprobs_valid"] is True and r["load_proof"] == "none" for r in new)
    # one version, a filter on a newer column, and pandas: the same union schema
    only_new = read_samples(lake.root, ["step-2"], filter=ds.field("logprobs_valid"))
    assert only_new.num_rows == len(new)
    frame = read_samples(str(lake.root), ["step-1"]).to_pandas()
    assert set(NEWER) <= set(frame.columns) and frame["parse_error"].isna().all()
    with pytest.raises(FileNotFoundError, match="step-9"):
        read_samples(lake.root, ["step-9"])

    # docs/lake.md's snippet for a trainer without legato-pipelines installed
    folder = str(lake.root / "samples")
    files = ds.dataset(folder, format="parquet", partitioning=None)
    schema = pa.unify_schemas(
        [f.physical_schema for f in files.get_fragments()], promote_options="permissive"
    )
    plain = ds.dataset(folder, format="parquet", schema=schema).to_table()
    assert set(NEWER) <= set(plain.column_names) and plain.num_rows == table.num_rows

    # the views union by name: the newer columns are there, null for the old file's rows
    got = lake.query(
        "SELECT policy_version, count(logprobs_valid) AS n FROM samples GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    assert got == [
        {"policy_version": "step-1", "n": 0},
        {"policy_version": "step-2", "n": len(new)},
    ]


def test_an_incomplete_group_is_marked_and_carries_no_advantage(tmp_path):
    # fake-001: 3 ok attempts of 3 (complete); fake-002: 2 ok + 1 error (incomplete)
    run = tmp_path / "run"
    write_run_dir(run, version="step-3", group=3, seed=4)
    meta = orjson.loads((run / "run.json").read_bytes())
    meta["knobs"] = {"group": 3, "oversample": 0.0}
    (run / "run.json").write_bytes(orjson.dumps(meta))

    out = tmp_path / "samples.parquet"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 of 2 groups are incomplete" in " ".join(result.output.split())
    rows = pq.read_table(out).to_pylist()
    complete = [r for r in rows if r["task_id"] == "fake-001"]
    partial = [r for r in rows if r["task_id"] == "fake-002"]
    assert complete and partial
    assert all(r["group_complete"] is False and r["advantage"] is None for r in partial)
    assert {(r["group_size"], r["group_size_expected"]) for r in partial} == {(2, 3)}
    assert all(r["group_complete"] is True and r["advantage"] is not None for r in complete)
    assert {(r["group_size"], r["group_size_expected"]) for r in complete} == {(3, 3)}

    # the lake partition (what training_samples writes) carries the same marks
    lake = Lake(tmp_path / "lake")
    lineage = Lineage("step-3", meta["task_set"], "r")
    lake.write("samples", "step-3", samples_table(export_steps(run), lineage))
    lake.refresh_views()
    got = lake.query(
        "SELECT task_id, bool_and(group_complete) AS complete, count(advantage) AS advantages "
        "FROM samples GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    assert got == [
        {"task_id": "fake-001", "complete": True, "advantages": len(complete)},
        {"task_id": "fake-002", "complete": False, "advantages": 0},
    ]


def _two_versions(tmp_path: Path) -> Lake:
    lake = Lake(tmp_path / "lake")
    for version in ("step-1", "step-2"):
        run = write_run_dir(lake.run_dir(version), version=version)
        lineage = Lineage(version, "t", "r")
        lake.write("rollouts", version, rollouts_table(run["records"], lineage))
        lake.write("samples", version, _samples(tmp_path, version))
        lake.write_chart(version, "time_share.png", b"\x89PNG")
    lake.refresh_views()
    return lake


def test_lake_drop_removes_a_version_from_the_files_and_the_views(tmp_path):
    lake = _two_versions(tmp_path)
    runner = CliRunner()
    args = ["lake", "drop", "step-1", "--lake", str(lake.root)]
    declined = runner.invoke(app, args, input="n\n")
    assert declined.exit_code == 1 and "nothing removed" in declined.output
    assert lake.versions("rollouts") == ["step-1", "step-2"]

    dropped = runner.invoke(app, [*args, "--yes"])
    assert dropped.exit_code == 0, dropped.output
    assert lake.versions("rollouts") == ["step-2"] and lake.versions("samples") == ["step-2"]
    assert not Path(lake.chart_dir("step-1")).exists()
    assert lake.run_dir("step-1").is_dir()  # kept without --run
    for view in ("rollouts", "samples"):
        assert lake.query(f"SELECT DISTINCT policy_version FROM {view}").to_pylist() == [
            {"policy_version": "step-2"}
        ]
    again = runner.invoke(app, [*args, "--yes"])
    assert again.exit_code == 2 and "no partition" in again.output

    assert (
        runner.invoke(
            app, ["lake", "drop", "step-2", "--lake", str(lake.root), "-y", "--run"]
        ).exit_code
        == 0
    )
    assert not lake.run_dir("step-2").exists() and lake.versions("rollouts") == []


def test_legato_duckdb_is_written_for_duckdb_1x(tmp_path):
    lake = _two_versions(tmp_path)
    header = lake.duckdb_path.read_bytes()[:20]
    assert header[8:12] == b"DUCK"
    # DuckDB's storage version 64 is what DuckDB 1.0-1.1 read (2.x's default writes 999)
    assert struct.unpack("<Q", header[12:20])[0] == 64
    # opened by DuckDB 1.x itself when LEGATO_DUCKDB1_PYTHON names a python that has it
    # (python3 -m venv /tmp/duck1 && /tmp/duck1/bin/pip install duckdb==1.1.3)
    old = os.environ.get("LEGATO_DUCKDB1_PYTHON")
    if not old:
        return
    script = (
        "import duckdb, sys; assert duckdb.__version__.startswith('1.'), duckdb.__version__; "
        "con = duckdb.connect(sys.argv[1], read_only=True); "
        "print(con.sql('SELECT count(*) FROM rollouts').fetchone()[0])"
    )
    out = subprocess.run([old, "-c", script, str(lake.duckdb_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (
        int(out.stdout) == lake.query("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py()
    )


def test_a_lock_held_elsewhere_names_the_holder_and_parquet_answers(tmp_path):
    lake = _two_versions(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "time.sleep(120)",
            str(lake.duckdb_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        runner = CliRunner()
        sql = "SELECT count(*) AS n FROM rollouts"
        locked = runner.invoke(app, ["lake", "query", sql, "--lake", str(lake.root), "--json"])
        text = " ".join(locked.output.split())
        assert locked.exit_code == 2, locked.output
        assert f"process {holder.pid}" in text and "--parquet" in text and "read_only" in text
        direct = runner.invoke(
            app, ["lake", "query", sql, "--lake", str(lake.root), "--json", "--parquet"]
        )
        assert direct.exit_code == 0, direct.output
        assert orjson.loads(direct.output) == {"n": 2 * 7}
    finally:
        holder.kill()
        holder.wait()


def _materialize(instance, server, tmp_path: Path, selection=None):
    import dagster as dg

    from legato_pipelines.assets import ASSETS
    from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource
    from tests.engine_support import fake_tasks

    tasks = tmp_path / "tasks.json"
    tasks.write_text(orjson.dumps(fake_tasks(2, success=0.5)).decode())
    return dg.materialize(
        ASSETS,
        partition_key="step-1",
        instance=instance,
        resources={
            "policy": PolicyResource(base_url=server.url, model=server.model),
            "desktops": DesktopPoolResource(backend="fake", desktops=2),
            "lake": LakeResource(root=str(tmp_path / "lake")),
        },
        run_config={
            "ops": {"rollout_batch": {"config": {"tasks": str(tasks), "group": 2, "max_steps": 2}}}
        }
        if selection is None
        else None,
        selection=selection,
        raise_on_error=False,
    )


def _logged(instance, run_id: str) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(run_id))


def test_a_partition_deleted_while_collecting_keeps_the_records_and_names_lake_drop(
    tmp_path, monkeypatch
):
    import dagster as dg

    from legato_pipelines.assets import policy_versions
    from legato_pipelines.desktops.backends.fake import FakeDesktop
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    graded = FakeDesktop.evaluate
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])

        async def evaluate(self, *args, **kwargs):  # the UI's "delete partition", mid-batch
            if instance.has_dynamic_partition(policy_versions.name, "step-1"):
                instance.delete_dynamic_partition(policy_versions.name, "step-1")
            return await graded(self, *args, **kwargs)

        monkeypatch.setattr(FakeDesktop, "evaluate", evaluate)
        with ScriptedPolicyServer() as server:
            result = _materialize(instance, server, tmp_path)
        run = instance.get_run_by_id(result.run_id)
        logged = _logged(instance, result.run_id)
    assert result.success and not result.get_step_failure_events()
    assert not result.get_asset_materialization_events()
    assert {e.step_key for e in result.all_events if e.event_type_value == "STEP_SKIPPED"} == {
        "rollouts",
        "training_samples",
        "profile_summary",
    }
    lake = Lake(tmp_path / "lake")
    records = (lake.run_dir("step-1") / "rollouts.jsonl").read_text().splitlines()
    assert len(records) >= 4  # what was collected is kept
    assert f"What was collected is kept: {len(records)} records" in logged
    assert "`legato lake drop step-1`" in logged and "Traceback" not in logged
    assert run.tags["legato/partition"] == "deleted mid-run"
    assert lake.versions("rollouts") == [] and lake.versions("samples") == []


@pytest.mark.slow
def test_a_partition_deleted_before_a_table_is_written_writes_nothing(tmp_path, monkeypatch):
    import dagster as dg

    from legato_pipelines.assets import policy_versions, rollouts, tables
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    with dg.instance_for_test() as instance, ScriptedPolicyServer() as server:
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
        first = _materialize(instance, server, tmp_path)
        assert first.success
        lake = Lake(tmp_path / "lake")
        lake.drop("step-1")  # the lake without the version; its run directory stays
        found = tables.find_batch

        def find_then_delete(*args, **kwargs):
            batch = found(*args, **kwargs)
            instance.delete_dynamic_partition(policy_versions.name, "step-1")
            return batch

        monkeypatch.setattr(tables, "find_batch", find_then_delete)
        again = _materialize(instance, server, tmp_path, selection=[rollouts])
    assert not again.success
    failure = again.get_step_failure_events()[0].step_failure_data
    assert failure.user_failure_data is not None  # a dagster.Failure, not an internal error
    assert "`legato lake drop step-1`" in failure.user_failure_data.description
    assert "Nothing was written" in failure.user_failure_data.description
    assert lake.versions("rollouts") == [] and lake.versions("steps") == []


def test_a_url_lake_reads_the_union_and_drops_a_version(tmp_path, monkeypatch):
    # fsspec's memory filesystem: the URL path of Lake (s3:// in production, test_scale_out_lake)
    monkeypatch.setenv("LEGATO_LAKE_CACHE", str(tmp_path / "cache"))
    lake = Lake(f"memory://legato-kinds/{tmp_path.name}")
    old = _samples(tmp_path, "step-1").select(OLD_COLUMNS)
    sink = pa.BufferOutputStream()
    pq.write_table(old, sink)
    lake.fs.pipe_file(lake.partition_file("samples", "step-1"), sink.getvalue().to_pybytes())
    lake.write("samples", "step-2", _samples(tmp_path, "step-2"))
    table = read_samples(lake)
    assert set(NEWER) <= set(table.column_names)
    assert set(table.column("policy_version").to_pylist()) == {"step-1", "step-2"}
    assert lake.query("SELECT count(logprobs_valid) AS n FROM samples", parquet=True).to_pylist()
    lake.drop("step-1")
    assert lake.versions("samples") == ["step-2"]
    assert read_samples(lake).column("policy_version").unique().to_pylist() == ["step-2"]
