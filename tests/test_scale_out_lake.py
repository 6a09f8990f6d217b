"""A shared lake: the lake root as an fsspec URL on a real S3-compatible server on loopback
(moto in server mode, its own process group) and as a local path, with the same behaviour;
run directories travel between hosts; Dagster runs on two "hosts" write one S3 lake that a
third reads through DuckDB.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from legato_pipelines import read_records
from legato_pipelines.assets import ASSETS, policy_versions
from legato_pipelines.errors import ConfigError
from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource
from legato_pipelines.store.lake import CACHE_ENV, Lake, is_url
from legato_pipelines.store.lake_tables import Lineage, profile_table, rollouts_table, steps_table
from tests.engine_support import fake_tasks
from tests.lake_synthetic import write_run_dir
from tests.scale_out_support import Processes

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a real HTTP server speaking the S3 API); yields its URL."""
    procs = Processes()
    try:
        _, port = procs.start_listening(
            "moto",
            lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            log=log_dir / "moto.log",
            ready="Running on http://127.0.0.1:",
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        assert procs.stop_all() == [] and procs.alive() == []


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path) -> str:
    """A fresh bucket; returns ``s3://<bucket>``. Credentials are moto's dummies.

    Every setting a lake's filesystem reads is set here (whatever an earlier test module left
    in the environment or in fsspec's instance cache), and the bucket is made through a fresh
    filesystem instance."""
    import fsspec

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "legato-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "legato-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache-host-a"))
    bucket = f"legato-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
    return f"s3://{bucket}"


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path) -> Lake:
    if request.param == "local":
        return Lake(tmp_path / "lake")
    return Lake(request.getfixturevalue("s3") + "/lake")


def fill(lake: Lake, tmp: Path, version: str, seed: int = 0) -> dict:
    run = write_run_dir(tmp / f"run-{version}", version=version, seed=seed)
    lineage = Lineage(version, run["summary"]["task_set"], f"run-{version}")
    lake.write("rollouts", version, rollouts_table(run["records"], lineage))
    lake.write("steps", version, steps_table(run["records"], lineage))
    lake.write("profile", version, profile_table(run["summary"], lineage))
    return run


def lake_files(lake: Lake) -> list[str]:
    if lake.remote:
        lake.fs.invalidate_cache()
        return sorted(p.split("/", 1)[1] for p in lake.fs.find(lake.root))
    return sorted(str(p.relative_to(lake.root)) for p in lake.root.rglob("*") if p.is_file())


@pytest.mark.slow
def test_partitions_and_duckdb_views_behave_the_same_on_s3_and_local(lake, tmp_path):
    runs = {v: fill(lake, tmp_path, v, seed=i) for i, v in enumerate(("step-1", "step-2"))}
    assert lake.versions("rollouts") == ["step-1", "step-2"]
    assert lake.versions("samples") == []
    parquet = [f for f in lake_files(lake) if f.endswith(".parquet")]
    assert len(parquet) == 6 and not [f for f in lake_files(lake) if ".tmp" in f]
    assert lake.read("rollouts", "step-2").num_rows == len(runs["step-2"]["records"])
    assert set(lake.refresh_views()) == {"rollouts", "steps", "profile", "time_share"}
    rows = lake.query("SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1")
    assert rows.to_pylist() == [
        {"policy_version": v, "n": len(runs[v]["records"])} for v in ("step-1", "step-2")
    ]
    fill(lake, tmp_path, "step-3", seed=3)  # a new partition shows without a rebuild
    assert lake.query("SELECT count(DISTINCT policy_version) AS n FROM steps").to_pylist() == [
        {"n": 3}
    ]
    with pytest.raises(FileNotFoundError):
        lake.read("samples", "step-1")


def test_a_failed_write_leaves_the_previous_partition_whole(lake, tmp_path, monkeypatch):
    fill(lake, tmp_path, "step-1")
    before = lake.read("rollouts", "step-1")
    replacement = rollouts_table(
        write_run_dir(tmp_path / "other", version="step-1", seed=9)["records"],
        Lineage("step-1", "t", "run-x"),
    )
    real_write = pq.write_table

    def write_half_then_fail(table, where, **kwargs):
        real_write(table.slice(0, 1), where, **kwargs)
        raise OSError("disk vanished mid-write")

    monkeypatch.setattr(pq, "write_table", write_half_then_fail)
    with pytest.raises(OSError, match="mid-write"):
        lake.write("rollouts", "step-1", replacement)
    monkeypatch.undo()
    assert lake.read("rollouts", "step-1").equals(before)
    assert not [f for f in lake_files(lake) if ".tmp" in f]


def test_run_directories_travel_between_hosts(s3, tmp_path, monkeypatch):
    host_a = Lake(s3 + "/lake")
    run = write_run_dir(host_a.run_dir("step-1"), version="step-1")
    assert host_a.push_run("step-1") == f"{s3}/lake/runs/policy_version=step-1"

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache-host-b"))
    host_b = Lake(s3 + "/lake")
    assert host_b.run_dir("step-1") != host_a.run_dir("step-1")
    assert not host_b.run_dir("step-1").exists()
    local = host_b.pull_run("step-1")
    assert [r["rollout_id"] for r in read_records(local)] == [
        r["rollout_id"] for r in run["records"]
    ]
    files_a = sorted(
        p.relative_to(host_a.run_dir("step-1")) for p in host_a.run_dir("step-1").rglob("*")
    )
    assert sorted(p.relative_to(local) for p in local.rglob("*")) == files_a
    # host B resumes and appends; host A pulls again and gets the longer run
    with open(local / "rollouts.jsonl", "a") as fh:
        fh.write(json.dumps({**run["records"][0], "rollout_id": "f" * 32}) + "\n")
    host_b.push_run("step-1")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache-host-a"))
    again = Lake(s3 + "/lake").pull_run("step-1")
    assert again == host_a.run_dir("step-1")
    assert len(read_records(again)) == len(run["records"]) + 1
    # a local copy that is already longer is kept (this host collected further)
    with open(again / "rollouts.jsonl", "a") as fh:
        fh.write(json.dumps({**run["records"][0], "rollout_id": "e" * 32}) + "\n")
    assert len(read_records(Lake(s3 + "/lake").pull_run("step-1"))) == len(run["records"]) + 2


@pytest.mark.slow
def test_a_new_lake_uses_the_endpoint_set_now_not_one_cached_earlier(s3, tmp_path, monkeypatch):
    """A long-lived process (or the next test module) reconfigures AWS_ENDPOINT_URL: a lake
    opened afterwards talks to the new endpoint, not to fsspec's cached instance of the old."""
    import fsspec

    before = Lake(s3 + "/lake")
    fill(before, tmp_path, "step-1")
    assert before.versions("rollouts") == ["step-1"]  # its filesystem has connected
    with moto_server(tmp_path / "moto-2") as second:
        monkeypatch.setenv("AWS_ENDPOINT_URL", second)
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir(s3.split("://", 1)[1])
        after = Lake(s3 + "/lake")
        assert after.versions("rollouts") == []  # the same bucket name, on the new server
        fill(after, tmp_path, "step-2")
        assert after.versions("rollouts") == ["step-2"]
    assert before.versions("rollouts") == ["step-1"]  # the old lake keeps its own endpoint


def test_urls_are_recognised_and_unknown_protocols_refused(tmp_path):
    assert is_url("s3://b/lake") and is_url("gs://b") and not is_url(tmp_path)
    assert not is_url("file:///srv/lake") and Lake(f"file://{tmp_path}/l").root == tmp_path / "l"
    with pytest.raises(ConfigError, match="cannot open"):
        Lake("nosuchproto://bucket/lake")


def test_collections_on_two_hosts_land_in_one_s3_lake_the_trainer_reads(
    s3, tmp_path, monkeypatch, policy_server
):
    """Two partitions materialized through Dagster, each on its own "host" (local cache);
    a third host (the trainer) sees both versions' samples via DuckDB and pyarrow."""
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(2, success=0.5)))
    root = s3 + "/lake"
    with dg.instance_for_test() as instance:
        for host, version in (("a", "step-1"), ("b", "step-2")):
            monkeypatch.setenv(CACHE_ENV, str(tmp_path / f"cache-host-{host}"))
            instance.add_dynamic_partitions(policy_versions.name, [version])
            result = dg.materialize(
                ASSETS,
                partition_key=version,
                instance=instance,
                resources={
                    "policy": PolicyResource(base_url=policy_server.url, model=policy_server.model),
                    "desktops": DesktopPoolResource(backend="fake", desktops=2),
                    "lake": LakeResource(root=root),
                },
                run_config={
                    "ops": {
                        "rollout_batch": {
                            "config": {"tasks": str(tasks), "group": 2, "max_steps": 2}
                        }
                    }
                },
            )
            assert result.success
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache-trainer"))
    trainer = Lake(root)
    assert trainer.versions("samples") == ["step-1", "step-2"]
    assert not trainer.duckdb_path.exists()  # built on first use on this host
    counts = trainer.query(
        "SELECT policy_version, count(*) AS n FROM samples GROUP BY 1 ORDER BY 1"
    )
    assert [r["policy_version"] for r in counts.to_pylist()] == ["step-1", "step-2"]
    assert all(r["n"] > 0 for r in counts.to_pylist())
    dataset = ds.dataset(
        f"{root.split('://', 1)[1]}/samples", filesystem=trainer.fs, format="parquet",
        partitioning="hive",
    )  # fmt: skip
    assert dataset.to_table().num_rows == sum(r["n"] for r in counts.to_pylist())
    for version in ("step-1", "step-2"):  # the run directories are in the lake as well
        summary = json.loads(trainer.fs.cat(f"{root}/runs/policy_version={version}/summary.json"))
        assert summary["missing"] == 0 and summary["policy"]["version"] == version


def test_legato_lake_queries_an_s3_lake_given_by_url(s3, tmp_path):
    from typer.testing import CliRunner

    from legato_pipelines.cli import app

    lake = Lake(s3 + "/lake")
    run = fill(lake, tmp_path, "step-1")
    out = CliRunner().invoke(
        app, ["lake", "query", "SELECT count(*) AS n FROM rollouts", "--lake", lake.root, "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"n": len(run["records"])}
