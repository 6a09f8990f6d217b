"""The four assets materialized through Dagster (``materialize``) on fake desktops against a
real scripted policy server on loopback: lake partitions, DuckDB views, lineage, metadata,
checks, resume, and the policy key staying out of every event."""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from dagster._serdes import serialize_value

from legato_pipelines import export_steps, profile, read_records
from legato_pipelines.assets import ASSETS, collect_job, policy_versions
from legato_pipelines.assets import checks as contract
from legato_pipelines.policy.config import API_KEY_ENV
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.lake_tables import Lineage, rollouts_table
from tests.engine_support import SECRET, fake_tasks
from tests.lake_synthetic import write_run_dir


@pytest.fixture
def tasks_file(tmp_path) -> Path:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(fake_tasks(3, success=0.5)))
    return path


def _run_config(tasks_file: Path, **knobs) -> dict:
    return {
        "ops": {
            "rollout_batch": {
                "config": {"tasks": str(tasks_file), "group": 3, "max_steps": 3, **knobs}
            }
        }
    }


def _materialize(
    instance,
    server,
    lake_root,
    tasks_file,
    version="step-1",
    policy=None,
    raise_on_error=True,
    **knobs,
):
    if version not in instance.get_dynamic_partitions(policy_versions.name):
        instance.add_dynamic_partitions(policy_versions.name, [version])
    return dg.materialize(
        ASSETS,
        partition_key=version,
        instance=instance,
        resources={
            "policy": policy or PolicyResource(base_url=server.url, model=server.model),
            "desktops": DesktopPoolResource(backend="fake", desktops=3),
            "lake": LakeResource(root=str(lake_root)),
        },
        run_config=_run_config(tasks_file, **knobs),
        raise_on_error=raise_on_error,
    )


def _metadata(result, asset: str) -> dict:
    events = [e for e in result.get_asset_materialization_events() if e.asset_key.path == [asset]]
    assert len(events) == 1
    return events[0].materialization.metadata


@pytest.mark.slow
def test_partition_materializes_lake_views_lineage_and_checks(
    tmp_path, policy_server, tasks_file, no_policy_key
):
    lake_root = tmp_path / "lake"
    with dg.instance_for_test() as instance:
        result = _materialize(instance, policy_server, lake_root, tasks_file)
        assert result.success
        lake = Lake(lake_root)
        run_dir = lake.run_dir("step-1")
        records = read_records(run_dir)
        exported = export_steps(run_dir)
        assert exported.num_rows > 0

        # Acceptance: the samples view has exactly the exported steps of this version.
        n = (
            lake.query("SELECT count(*) AS n FROM samples WHERE policy_version = 'step-1'")
            .column("n")[0]
            .as_py()
        )
        assert n == exported.num_rows
        assert lake.query("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py() == len(
            records
        )
        assert lake.query("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == sum(
            len(r["steps"]) for r in records
        )

        # Lineage on every row: version, task set, the collecting run, the rollout.
        task_set = json.loads((run_dir / "run.json").read_text())["task_set"]
        for table in ("rollouts", "steps", "samples"):
            rows = lake.query(
                f"SELECT DISTINCT policy_version, task_set, run_id FROM {table}"
            ).to_pylist()
            assert rows == [
                {"policy_version": "step-1", "task_set": task_set, "run_id": result.run_id}
            ]
            ids = set(
                lake.query(f"SELECT DISTINCT rollout_id FROM {table}")
                .column("rollout_id")
                .to_pylist()
            )
            assert ids and ids <= {r["rollout_id"] for r in records}
        profile = lake.query("SELECT * FROM profile").to_pylist()
        assert len(profile) == 1 and profile[0]["records"] == len(records)

        batch = _metadata(result, "rollout_batch")
        for key in (
            "tasks_path",
            "task_set",
            "model",
            "knobs",
            "counts",
            "success_rate",
            "rollouts_per_hour",
            "run_dir",
        ):
            assert key in batch, key
        assert batch["task_set"].value == task_set
        assert batch["model"].value == policy_server.model
        assert batch["knobs"].value["group"] == 3
        assert batch["run_dir"].value == str(run_dir)
        assert batch["dagster/row_count"].value == len(records)
        final = [r for r in records if r["status"] in ("ok", "truncated")]
        assert batch["success_rate"].value == pytest.approx(
            sum(r["reward"] for r in final) / len(final), abs=5e-5
        )

        samples = _metadata(result, "training_samples")
        assert samples["dagster/row_count"].value == exported.num_rows
        assert "response_logprobs" in [
            c.name for c in samples["dagster/column_schema"].schema.columns
        ]
        assert samples["preview"].value.startswith("| rollout_id")
        profile_meta = _metadata(result, "profile_summary")
        for chart in ("time_share_chart", "success_by_task_chart"):
            assert (
                profile_meta[chart].value.startswith("![")
                and "data:image/png;base64," in profile_meta[chart].value
            )
        # A trainer reads every table folder as docs/lake.md says: pyarrow and pandas.
        for table in ("rollouts", "steps", "samples", "profile"):
            folder = lake_root / table
            data = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
            assert {p.suffix for p in folder.rglob("*") if p.is_file()} == {".parquet"}, table
            assert data.num_rows > 0 and data.column("policy_version").unique().to_pylist() == [
                "step-1"
            ]
            assert len(pd.read_parquet(folder / "policy_version=step-1")) == data.num_rows
            assert len(pd.read_parquet(folder, partitioning=None)) == data.num_rows
        charts = lake.chart_dir("step-1")
        assert profile_meta["charts"].value == str(charts)
        assert {p.name for p in charts.iterdir()} == {
            "time_share.png",
            "success_by_task.png",
            "success_across_versions.png",
        }
        assert (charts / "time_share.png").stat().st_size > 1000

        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert set(checks) == {
            "no_attempt_unaccounted",
            "logprobs_coverage",
            "advantages_centered",
            "success_rate_reported",
        }
        assert all(c.passed for c in checks.values())


@pytest.mark.slow
def test_rematerializing_a_partition_resumes_its_run_directory(
    tmp_path, policy_server, tasks_file, no_policy_key
):
    lake_root = tmp_path / "lake"
    with dg.instance_for_test() as instance:
        first = _materialize(instance, policy_server, lake_root, tasks_file)
        calls = len(policy_server.chat_requests)
        second = _materialize(instance, policy_server, lake_root, tasks_file)
        assert first.success and second.success
        assert len(policy_server.chat_requests) == calls  # nothing left to collect
        lake = Lake(lake_root)
        assert lake.query("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py() == len(
            read_records(lake.run_dir("step-1"))
        )
        # The second run re-wrote the tables; the rows still name the run that collected them.
        assert set(
            lake.query("SELECT DISTINCT run_id FROM samples").column("run_id").to_pylist()
        ) == {second.run_id}


@pytest.mark.slow
def test_a_policy_outage_fails_the_batch_and_rematerializing_resumes_it(
    tmp_path, policy_server, tasks_file, no_policy_key
):
    """The server fails every call once the first record is written: ``rollout_batch`` fails
    saying how many groups are incomplete and how to resume (its records kept); materializing
    the partition again re-runs those attempts and succeeds, the accounting check passing."""
    import threading

    lake_root = tmp_path / "lake"
    run_dir = Lake(lake_root).run_dir("step-1")
    policy_server.latency.median = 0.1

    def outage():
        deadline = time.time() + 60
        while time.time() < deadline and not (run_dir.exists() and read_records(run_dir)):
            time.sleep(0.01)
        policy_server.faults.error_every = 1

    cutter = threading.Thread(target=outage)
    cutter.start()
    with dg.instance_for_test() as instance:
        first = _materialize(instance, policy_server, lake_root, tasks_file, raise_on_error=False)
        cutter.join()
        assert not first.success
        failure = next(e.step_failure_data.error for e in first.all_events if e.is_step_failure)
        assert "groups incomplete" in failure.message and "policy" in failure.message
        assert "materialize this partition again" in failure.message
        errored = sum(1 for r in read_records(run_dir) if r["status"] == "error")
        assert errored

        policy_server.faults.error_every = 0  # the server is back
        second = _materialize(instance, policy_server, lake_root, tasks_file)
        assert second.success
        meta = _metadata(second, "rollout_batch")
        assert meta["missing"].value == 0
        checks = {c.check_name: c.passed for c in second.get_asset_check_evaluations()}
        assert checks[contract.NO_ATTEMPT_UNACCOUNTED.name]
        assert profile(run_dir)["retries"] == errored
        assert profile(run_dir)["groups"] == {"total": 3, "closed": 3}


@pytest.mark.slow
def test_policy_key_reaches_the_server_but_no_event(tmp_path, tasks_file, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, SECRET)
    with (
        ScriptedPolicyServer(flavor="vllm", api_key=SECRET) as server,
        dg.instance_for_test() as instance,
    ):
        policy = PolicyResource(
            base_url=server.url, model=server.model, api_key=dg.EnvVar(API_KEY_ENV)
        )
        assert SECRET not in repr(policy)
        result = _materialize(instance, server, tmp_path / "lake", tasks_file, policy=policy)
        assert result.success
        assert server.chat_requests and all(r.authorized for r in server.chat_requests)
        run = instance.get_run_by_id(result.run_id)
        blobs = [serialize_value(e) for e in instance.all_logs(result.run_id)]
        blobs.append(serialize_value(run))
        blobs.append(json.dumps(run.run_config))
        assert not [b for b in blobs if SECRET in b]
    lake_files = [
        p
        for p in (tmp_path / "lake").rglob("*")
        if p.is_file() and p.suffix in (".parquet", ".json", ".jsonl", ".duckdb")
    ]
    assert lake_files and not [p for p in lake_files if SECRET.encode() in p.read_bytes()]


def test_policy_resource_exposes_key_only_while_collecting(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    policy = PolicyResource(base_url="http://127.0.0.1:1", model="m", api_key=SECRET)
    import os

    with policy.credentials():
        assert os.environ[API_KEY_ENV] == SECRET
    assert API_KEY_ENV not in os.environ
    config = policy.config("step-3", model="adapter-3")
    assert (config.version, config.model) == ("step-3", "adapter-3")
    assert SECRET not in config.model_dump_json()


@pytest.mark.slow
def test_unknown_partition_is_refused(tmp_path, policy_server, tasks_file):
    with dg.instance_for_test() as instance, pytest.raises(dg.DagsterUnknownPartitionError):
        dg.materialize(
            ASSETS,
            partition_key="never-added",
            instance=instance,
            resources={
                "policy": PolicyResource(base_url=policy_server.url, model=policy_server.model),
                "desktops": DesktopPoolResource(),
                "lake": LakeResource(root=str(tmp_path)),
            },
            run_config=_run_config(tasks_file),
        )


def test_collect_job_selects_the_four_assets():
    from legato_pipelines.definitions import defs

    job = defs.resolve_job_def(collect_job.name)
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {
        "rollout_batch",
        "rollouts",
        "training_samples",
        "profile_summary",
    }
    assert job.partitions_def == policy_versions
    batch = defs.resolve_assets_def("rollout_batch")
    assert batch.op.pool == "legato_collection"


# -- the checks fail when the contract is broken (synthetic partitions) ----------------------


def test_checks_catch_broken_contracts(tmp_path):
    run = write_run_dir(tmp_path / "run", logprobs=False)
    table = rollouts_table(run["records"], Lineage("step-1", "t", "r"))
    assert contract.no_attempt_unaccounted(table, run["summary"]["scheduled"]).passed
    assert not contract.no_attempt_unaccounted(
        table, run["summary"]["scheduled"] + 1
    ).passed  # one lost attempt
    twice = pa.concat_tables([table, table.slice(1, 1)])  # a final record written twice
    assert not contract.no_attempt_unaccounted(twice, run["summary"]["scheduled"]).passed

    samples = pa.table(
        {
            "group_id": ["g1", "g1", "g1", "g2", "g2"],
            "rollout_id": ["a", "a", "b", "c", "d"],
            "reward": [1.0, 1.0, 0.0, 1.0, 1.0],
            "advantage": [1.0, 1.0, -1.0, 0.0, 0.0],
            "response_logprobs": [[-0.1], [-0.2], None, [-0.3], [-0.4]],
            "response_token_ids": [[1], [2], [3], [4], [5]],
        }
    )
    assert contract.advantages_centered(samples).passed
    shifted = samples.set_column(3, "advantage", pa.array([1.5, 1.5, -1.0, 0.0, 0.0]))
    assert not contract.advantages_centered(shifted).passed
    flat_nonzero = samples.set_column(3, "advantage", pa.array([1.0, 1.0, -1.0, 0.5, -0.5]))
    assert not contract.advantages_centered(flat_nonzero).passed  # g2 has no variance
    coverage = contract.logprobs_coverage(samples, floor=0.95)
    assert not coverage.passed and coverage.metadata["logprobs_share"].value == pytest.approx(0.8)
    assert contract.logprobs_coverage(samples, floor=0.8).passed
    assert not contract.success_rate_reported({"success_rate": None}).passed
    assert contract.success_rate_reported({"success_rate": 0.25, "counts": {"ok": 4}}).passed
