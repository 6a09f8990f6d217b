"""The code location loads, validates with ``dg check defs``, is configured from the
environment, and runs from the command line the way the acceptance criteria say."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dagster as dg
import pytest
import yaml

from legato_pipelines import export_steps
from legato_pipelines.assets import policy_versions
from legato_pipelines.policy.config import API_KEY_ENV
from legato_pipelines.resources.defaults import default_resources
from legato_pipelines.store.lake import Lake
from tests.engine_support import SECRET, fake_tasks

REPO = Path(__file__).resolve().parents[1]
ENV_NAMES = (
    "LEGATO_POLICY_URL",
    "LEGATO_POLICY_MODEL",
    API_KEY_ENV,
    "LEGATO_BACKEND",
    "LEGATO_DESKTOPS",
    "LEGATO_LAKE",
    "LEGATO_CHECKPOINTS",
    "LEGATO_BACKEND_OPTIONS",
)


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and k != "DAGSTER_HOME"}
    return {**env, **(extra or {})}


def test_definitions_load_with_job_sensor_and_resources():
    from legato_pipelines.definitions import defs

    repo = defs.get_repository_def()
    assert {"collect_job"} <= {j.name for j in repo.get_all_jobs()}
    sensor = defs.resolve_sensor_def("checkpoint_sensor")
    assert sensor.job_name == "collect_job"
    assert set(defs.resources) == {"policy", "desktops", "lake", "checkpoints"}
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {"rollout_batch", "rollouts", "training_samples", "profile_summary"}
    for key in keys:
        assert defs.resolve_assets_def(key).partitions_def == policy_versions


def test_resources_come_from_the_environment_and_the_key_stays_a_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("LEGATO_POLICY_URL", "http://127.0.0.1:8123")
    monkeypatch.setenv("LEGATO_POLICY_MODEL", "Qwen/Qwen3-VL-8B-Instruct")
    monkeypatch.setenv(API_KEY_ENV, SECRET)
    monkeypatch.setenv("LEGATO_DESKTOPS", "7")
    monkeypatch.setenv("LEGATO_BACKEND", "local")
    monkeypatch.setenv("LEGATO_BACKEND_OPTIONS", '{"display_base": 50}')
    monkeypatch.setenv("LEGATO_LAKE", str(tmp_path))
    resources = default_resources()
    policy = resources["policy"]
    assert isinstance(policy.api_key, dg.EnvVar) and policy.api_key.env_var_name == API_KEY_ENV
    assert (
        isinstance(policy.base_url, dg.EnvVar)
        and policy.base_url.get_value() == "http://127.0.0.1:8123"
    )
    assert SECRET not in repr(resources)
    assert resources["desktops"].backend == "local" and resources["desktops"].options == {
        "display_base": 50
    }
    assert resources["desktops"].desktops.get_value() == 7
    # Unset: plain defaults, no key at all.
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    resources = default_resources()
    assert resources["policy"].api_key is None and resources["desktops"].backend == "fake"
    assert resources["lake"].root == str(Path.cwd() / "lake")
    monkeypatch.setenv("LEGATO_BACKEND_OPTIONS", "[1]")
    with pytest.raises(ValueError, match="LEGATO_BACKEND_OPTIONS"):
        default_resources()


def test_workspace_and_dg_project_name_the_same_location():
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    [entry] = workspace["load_from"]
    dg_project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["dg"]["project"]
    assert entry["python_module"]["module_name"] == dg_project["code_location_target_module"]
    assert entry["python_module"]["location_name"] == dg_project["code_location_name"]


def test_dagster_yaml_is_a_valid_instance_config(tmp_path):
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.get_concurrency_config().run_queue_config.max_concurrent_runs == 4
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 2
        assert not instance.telemetry_enabled
        assert Path(instance.storage_directory()).resolve().is_relative_to(tmp_path.resolve())


@pytest.mark.slow
def test_dg_check_defs_passes():
    out = subprocess.run(
        ["dg", "check", "defs"],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "All definitions loaded successfully" in out.stdout + out.stderr


@pytest.mark.slow
def test_acceptance_dagster_asset_materialize_from_the_command_line(tmp_path, policy_server):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(3)))
    lake_root = tmp_path / "lake"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(policy_versions.name, ["step-7"])
    env = _clean_env(
        {
            "DAGSTER_HOME": str(home),
            "LEGATO_POLICY_URL": policy_server.url,
            "LEGATO_POLICY_MODEL": policy_server.model,
            "LEGATO_TASKS": str(tasks),
            "LEGATO_LAKE": str(lake_root),
        }
    )
    command = [
        sys.executable, "-m", "dagster", "asset", "materialize", "-m", "legato_pipelines.definitions",
        "--select", "rollout_batch,rollouts,training_samples,profile_summary", "--partition", "step-7",
        "--config-json", json.dumps({"ops": {"rollout_batch": {"config": {"group": 2, "max_steps": 3}}}}),
    ]  # fmt: skip
    out = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lake = Lake(lake_root)
    expected = export_steps(lake.run_dir("step-7")).num_rows
    assert expected > 0
    n = (
        lake.query("SELECT count(*) AS n FROM samples WHERE policy_version = 'step-7'")
        .column("n")[0]
        .as_py()
    )
    assert n == expected
    assert sorted(
        lake.query("SELECT view_name FROM duckdb_views() WHERE NOT internal").column(0).to_pylist()
    ) == [
        "profile",
        "rollouts",
        "samples",
        "steps",
        "time_share",
    ]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [run] = instance.get_runs()
        assert (
            run.status == dg.DagsterRunStatus.SUCCESS and run.tags["dagster/partition"] == "step-7"
        )


@pytest.mark.slow
def test_legato_demo_runs_the_main_job_through_dagster(tmp_path):
    home = tmp_path / "home"
    env = _clean_env({"COLUMNS": "200"})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato_pipelines",
            "demo",
            "--home",
            str(home),
            "--version",
            "step-1",
            "--group",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lake = Lake(home / "lake")
    assert str(lake.duckdb_path) in out.stdout and str(lake.root) in out.stdout
    samples = export_steps(lake.run_dir("step-1")).num_rows
    assert f"│ {samples}" in out.stdout  # the first SQL answer counts the exported samples
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_dynamic_partitions(policy_versions.name) == ["step-1"]
        assert [r.status for r in instance.get_runs()] == [dg.DagsterRunStatus.SUCCESS]
