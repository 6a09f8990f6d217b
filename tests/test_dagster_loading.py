"""Checkpoints reach the model server through Dagster: the real checkpoint sensor on a real
instance sees ``step-1`` and ``step-2``, each of its run requests is materialized for real
(fake desktops, the scripted server on loopback in vLLM and SGLang flavors), each run loads its
checkpoint before collecting, every request of the ``step-2`` run is answered by the ``step-2``
weights, and the lake rows carry the served model, the checkpoint path and its fingerprint.
Failures fail the run before any desktop starts, with the server's words, visible on the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import pytest

from legato_pipelines import read_records
from legato_pipelines.assets import ASSETS, policy_versions
from legato_pipelines.assets.collection import LOAD_ERROR_TAG, LOAD_TAG
from legato_pipelines.policy.loading import fingerprint
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.resources import (
    CheckpointSourceResource,
    DesktopPoolResource,
    LakeResource,
    PolicyResource,
)
from legato_pipelines.store.lake import Lake
from tests.dagster_support import launch_request, sensor_tick
from tests.engine_support import fake_tasks
from tests.test_policy_loading import adapter, weights


@pytest.fixture
def tasks_file(tmp_path) -> Path:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(fake_tasks(2, success=0.5)))
    return path


# The checkpoints here are written whole before the sensor looks (as a trainer that renames a
# finished folder into place): stable_s=0 counts a complete folder at once.
# tests/test_dagster_sensor.py covers the default wait for sizes to settle.


def _tick(instance, cursor, source, policy):
    return sensor_tick(instance, cursor, source, policy)


def _run(instance, request, policy, lake_root, tasks_file, raise_on_error=True):
    """Materialize what a sensor's run request asks for, as the daemon would launch it."""
    run_config = {
        "ops": {"rollout_batch": {"config": {"tasks": str(tasks_file), "group": 2, "max_steps": 2}}}
    }
    desktops = DesktopPoolResource(backend="fake", desktops=2)
    return launch_request(
        instance, request, policy, lake_root, desktops, run_config, raise_on_error
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flavor", "load", "make"),
    [("vllm", "lora", adapter), ("sglang", "weights", weights), ("sglang", "lora", adapter)],
)
def test_sensor_runs_load_each_checkpoint_and_rows_carry_the_weights(
    tmp_path, tasks_file, flavor, load, make, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    lake_root = tmp_path / "lake"
    with (
        ScriptedPolicyServer(flavor=flavor, runtime_lora=True) as server,
        dg.instance_for_test() as instance,
    ):
        policy = PolicyResource(base_url=server.url, model=server.model, load=load)
        source = CheckpointSourceResource(directory=str(ckpts), stable_s=0)
        ckpts.mkdir()
        cursor = None
        for version in ("step-1", "step-2"):
            path = make(ckpts, version)
            result = _tick(instance, cursor, source, policy)
            cursor = result.cursor
            [request] = result.run_requests
            assert request.partition_key == version
            before = len(server.requests)
            run = _run(instance, request, policy, lake_root, tasks_file)
            assert run.success
            log = list(server.requests)[before:]
            chats = [r for r in log if r.path == "/v1/chat/completions"]
            loads = [
                i
                for i, r in enumerate(log)
                if r.path.endswith(("lora_adapter", "from_disk")) and "unload" not in r.path
            ]
            first_chat = next(i for i, r in enumerate(log) if r.path == "/v1/chat/completions")
            assert loads and loads[0] < first_chat  # loaded before collecting
            assert chats and {r.served for r in chats} == {version}  # every request: these weights
            tags = instance.get_run_by_id(run.run_id).tags
            assert tags[LOAD_TAG] == f"{load}: loaded"
            batch = [
                e
                for e in run.get_asset_materialization_events()
                if e.asset_key.path == ["rollout_batch"]
            ][0]
            meta = batch.materialization.metadata
            assert meta["checkpoint_fingerprint"].value == fingerprint(path)["digest"]

        lake = Lake(lake_root)
        for table in ("rollouts", "steps", "samples", "profile"):
            rows = lake.query(
                f"SELECT DISTINCT policy_version, served_model, checkpoint_path, checkpoint_fingerprint "
                f"FROM {table} ORDER BY policy_version"
            ).to_pylist()
            expected = []
            for version in ("step-1", "step-2"):
                path = ckpts / version
                served = (
                    server.model
                    if load == "weights"
                    else (version if flavor == "vllm" else f"{server.model}:{version}")
                )
                expected.append(
                    {
                        "policy_version": version,
                        "served_model": served,
                        "checkpoint_path": str(path.resolve()),
                        "checkpoint_fingerprint": fingerprint(path)["digest"],
                    }
                )
            assert rows == expected, table
        # A quiet tick afterwards: nothing new, nothing waiting.
        assert "no new policy version" in _tick(instance, cursor, source, policy).skip_message


@pytest.mark.slow
def test_load_failure_fails_the_run_before_any_desktop_with_the_servers_words(
    tmp_path, tasks_file, monkeypatch, no_policy_key
):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    ckpts = tmp_path / "ckpts"
    adapter(ckpts, "step-1")
    with ScriptedPolicyServer(flavor="vllm") as server, dg.instance_for_test() as instance:
        policy = PolicyResource(base_url=server.url, model=server.model, load="lora")
        result = _tick(
            instance, None, CheckpointSourceResource(directory=str(ckpts), stable_s=0), policy
        )
        [request] = result.run_requests
        run = _run(instance, request, policy, tmp_path / "lake", tasks_file, raise_on_error=False)
        assert not run.success
        assert server.chat_requests == []
        run_dir = Lake(tmp_path / "lake").run_dir("step-1")
        assert not (run_dir / "rollouts.jsonl").exists()  # no desktop, no attempt
        tags = instance.get_run_by_id(run.run_id).tags
        assert tags[LOAD_TAG] == "lora: failed"
        assert "answered HTTP 404" in tags[LOAD_ERROR_TAG]
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in tags[LOAD_ERROR_TAG]
        error = run.get_step_failure_events()[0].step_failure_data.error.to_string()
        assert "/v1/load_lora_adapter answered HTTP 404: Not Found" in error
        assert "(in Dagster: LEGATO_POLICY_LOAD / the policy resource's load" in error


@pytest.mark.slow
def test_external_refuses_to_start_when_the_server_does_not_list_the_version(
    tmp_path, tasks_file, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    path = adapter(ckpts, "step-1")
    with (
        ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server,
        dg.instance_for_test() as instance,
    ):
        policy = PolicyResource(base_url=server.url, model=server.model, load="external")
        result = _tick(
            instance, None, CheckpointSourceResource(directory=str(ckpts), stable_s=0), policy
        )
        [request] = result.run_requests
        run = _run(instance, request, policy, tmp_path / "lake", tasks_file, raise_on_error=False)
        assert not run.success and server.chat_requests == []
        tags = instance.get_run_by_id(run.run_id).tags
        assert tags[LOAD_TAG] == "external: failed"
        assert "does not serve version 'step-1'" in tags[LOAD_ERROR_TAG]
        # The trainer loads it; a new run verifies it and collects against it.
        server.adapters["step-1"] = str(path.resolve())
        run = _run(instance, request, policy, tmp_path / "lake", tasks_file)
        assert run.success and {r.served for r in server.chat_requests} == {"step-1"}
        assert instance.get_run_by_id(run.run_id).tags[LOAD_TAG] == "external: verified"


@pytest.mark.slow
def test_reexecution_keeps_lineage_and_refuses_a_changed_checkpoint(
    tmp_path, tasks_file, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    path = adapter(ckpts, "step-1")
    lake_root = tmp_path / "lake"
    with (
        ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server,
        dg.instance_for_test() as instance,
    ):
        # No sensor tag: the folder comes from checkpoint_root (LEGATO_CHECKPOINTS).
        policy = PolicyResource(
            base_url=server.url, model=server.model, load="lora", checkpoint_root=str(ckpts)
        )
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
        request = dg.RunRequest(partition_key="step-1", tags={})
        first = _run(instance, request, policy, lake_root, tasks_file)
        second = _run(instance, request, policy, lake_root, tasks_file)
        assert first.success and second.success
        lake = Lake(lake_root)
        for table in ("rollouts", "steps", "samples"):
            rows = lake.query(f"SELECT DISTINCT run_id, collect_run_id FROM {table}").to_pylist()
            assert rows == [{"run_id": second.run_id, "collect_run_id": first.run_id}], table
        records = read_records(lake.run_dir("step-1"))
        assert {r["collected_by"] for r in records} == {first.run_id}

        (path / "adapter_model.safetensors").write_bytes(b"retrained weights" * 10)
        loads = len(server.loads)
        third = _run(instance, request, policy, lake_root, tasks_file, raise_on_error=False)
        assert not third.success
        assert len(server.loads) == loads  # refused before loading anything
        error = third.get_step_failure_events()[0].step_failure_data.error.to_string()
        assert "the checkpoint folder changed" in error


def test_sensor_names_folders_that_are_waiting(tmp_path, no_policy_key):
    ckpts = tmp_path / "ckpts"
    ready = weights(ckpts, "step-1")
    half = weights(ckpts, "step-2")
    (half / "model-00002-of-00002.safetensors").unlink()
    (ckpts / "step-3").mkdir()
    (ckpts / "step-3" / "adapter_model.safetensors.tmp").write_bytes(b"x")
    policy = PolicyResource(base_url="http://127.0.0.1:9", model="unused")
    with dg.instance_for_test() as instance:
        source = CheckpointSourceResource(directory=str(ckpts), stable_s=0)
        first = _tick(instance, None, source, policy)
        assert [r.partition_key for r in first.run_requests] == ["step-1"]
        assert first.run_requests[0].tags["legato/checkpoint"] == str(ready)
        skip = _tick(instance, first.cursor, source, policy)
        assert isinstance(skip, dg.SkipReason)
        assert (
            "waiting: step-2 (model.safetensors.index.json names 1 missing shard(s)"
            in skip.skip_message
        )
        assert "step-3 (still being written (adapter_model.safetensors.tmp))" in skip.skip_message
        marker = CheckpointSourceResource(directory=str(ckpts), ready_marker="READY")
        skip = _tick(instance, None, marker, policy)
        assert "step-1 (no READY marker yet)" in skip.skip_message


@pytest.mark.slow
def test_lake_rows_say_which_weights_were_proven(tmp_path, tasks_file, no_policy_key):
    """load_mode and load_proof tell proven rows from rows of a run that loaded nothing
    (load none: checkpoint_path / fingerprint are what the run was told, unproven); legato
    export carries the same weights columns."""
    from legato_pipelines.store.export import export_steps

    ckpts = tmp_path / "ckpts"
    for version in ("step-1", "step-2"):
        adapter(ckpts, version)
    lake_root = tmp_path / "lake"
    with (
        ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server,
        dg.instance_for_test() as instance,
    ):
        for version, load in (("step-1", "lora"), ("step-2", "none")):
            policy = PolicyResource(
                base_url=server.url, model=server.model, load=load, checkpoint_root=str(ckpts)
            )
            instance.add_dynamic_partitions(policy_versions.name, [version])
            request = dg.RunRequest(partition_key=version, tags={})
            assert _run(instance, request, policy, lake_root, tasks_file).success
    lake = Lake(lake_root)
    for table in ("rollouts", "steps", "samples", "profile"):
        rows = lake.query(
            f"SELECT DISTINCT policy_version, load_mode, load_proof, checkpoint_path FROM {table} "
            "ORDER BY policy_version"
        ).to_pylist()
        assert rows == [
            {
                "policy_version": "step-1",
                "load_mode": "lora",
                "load_proof": "models_listing",
                "checkpoint_path": str((ckpts / "step-1").resolve()),
            },
            {
                "policy_version": "step-2",
                "load_mode": "none",
                "load_proof": "none",
                "checkpoint_path": str((ckpts / "step-2").resolve()),
            },
        ], table
    proven = lake.query("SELECT count(*) AS n FROM samples WHERE load_proof <> 'none'")
    assert proven.to_pylist()[0]["n"] > 0
    exported = export_steps(lake.run_dir("step-1")).to_pylist()
    assert exported and {
        (r["served_model"], r["checkpoint_path"], r["load_mode"], r["load_proof"]) for r in exported
    } == {("step-1", str((ckpts / "step-1").resolve()), "lora", "models_listing")}
    assert {r["checkpoint_fingerprint"] for r in exported} == {
        fingerprint(ckpts / "step-1")["digest"]
    }


@pytest.mark.slow
def test_models_source_with_a_slash_in_the_model_id_verifies_the_model_it_calls(
    tmp_path, tasks_file, no_policy_key
):
    """LEGATO_CHECKPOINT_SOURCE=models + LEGATO_POLICY_LOAD=external: the partition key of
    model 'team/step-40' is 'team--step-40'; the run checks the model it calls."""
    path = adapter(tmp_path / "ckpts", "step-40")
    with (
        ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server,
        dg.instance_for_test() as instance,
    ):
        server.adapters["team/step-40"] = str(path.resolve())  # the trainer loaded it
        policy = PolicyResource(base_url=server.url, model=server.model, load="external")
        source = CheckpointSourceResource(source="models", pattern="team/*")
        result = _tick(instance, None, source, policy)
        [request] = result.run_requests
        assert request.partition_key == "team--step-40"
        run_config = {
            "ops": {
                "rollout_batch": {
                    "config": {
                        **request.run_config["ops"]["rollout_batch"]["config"],
                        "tasks": str(tasks_file),
                        "group": 2,
                        "max_steps": 2,
                    }
                }
            }
        }
        run = dg.materialize(
            ASSETS,
            partition_key=request.partition_key,
            instance=instance,
            tags=request.tags,
            resources={
                "policy": policy,
                "desktops": DesktopPoolResource(backend="fake", desktops=2),
                "lake": LakeResource(root=str(tmp_path / "lake")),
            },
            run_config=run_config,
        )
        assert run.success
        assert {r.served for r in server.chat_requests} == {"team/step-40"}
        assert instance.get_run_by_id(run.run_id).tags[LOAD_TAG] == "external: verified"


@pytest.mark.slow
def test_a_bad_weights_route_fails_the_run_naming_the_variable(tmp_path, tasks_file):
    path = weights(tmp_path / "ckpts", "step-1")
    with dg.instance_for_test() as instance:
        for route in ("update_weights", "http://127.0.0.1:9/update_weights"):
            policy = PolicyResource(
                base_url="http://127.0.0.1:9", model="m", load="weights", weights_route=route
            )
            instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
            request = dg.RunRequest(partition_key="step-1", tags={"legato/checkpoint": str(path)})
            run = _run(instance, request, policy, tmp_path / "lake", tasks_file, False)
            assert not run.success
            error = run.get_step_failure_events()[0].step_failure_data.error.to_string()
            assert "load.weights_route" in error and "LEGATO_POLICY_WEIGHTS_ROUTE" in error
            assert "Traceback" not in error.split("\n")[0]


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("LEGATO_POLICY_SERVER", "tgi", "LEGATO_POLICY_SERVER='tgi' is not a valid load_server"),
        ("LEGATO_POLICY_LOAD", "sideways", "LEGATO_POLICY_LOAD='sideways' is not a valid load"),
        ("LEGATO_POLICY_LOAD_KEEP", "0", "LEGATO_POLICY_LOAD_KEEP='0' is not a whole number >= 1"),
        ("LEGATO_POLICY_LOAD_KEEP", "abc", "LEGATO_POLICY_LOAD_KEEP='abc' is not a whole number"),
        ("LEGATO_POLICY_WEIGHTS_ROUTE", "update_weights", "fix: set LEGATO_POLICY_WEIGHTS_ROUTE"),
        ("LEGATO_POLICY_WEIGHTS_PAYLOAD", "[1]", 'e.g. \'{"model_path": "{checkpoint}"}\''),
        ("LEGATO_POLICY_LOAD_TIMEOUT", "0", "LEGATO_POLICY_LOAD_TIMEOUT='0' is not a number"),
        ("LEGATO_POLICY_LOAD_WAIT", "soon", "LEGATO_POLICY_LOAD_WAIT='soon' is not a number"),
    ],
)
def test_every_bad_load_variable_fails_when_the_code_location_loads(
    monkeypatch, name, value, words
):
    """One rule for every LEGATO_POLICY_* load variable: checked when the code location
    loads, the message names the variable (never a run that fails later with Dagster's raw
    coercion error)."""
    from legato_pipelines.errors import ConfigError
    from legato_pipelines.resources.defaults import default_resources

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        default_resources()
    assert words in str(info.value)


def test_load_choices_are_case_insensitive_and_new_settings_reach_the_spec(monkeypatch):
    from legato_pipelines.resources.defaults import default_resources

    monkeypatch.setenv("LEGATO_POLICY_LOAD", "LoRA")
    monkeypatch.setenv("LEGATO_POLICY_SERVER", "SGLang")
    monkeypatch.setenv("LEGATO_POLICY_LOAD_TIMEOUT", "90")
    monkeypatch.setenv("LEGATO_POLICY_LOAD_WAIT", "0")
    policy = default_resources()["policy"]
    assert (policy.load, policy.load_server) == ("lora", "sglang")
    spec = policy.load_spec("step-1")
    assert (spec.mode, spec.server, spec.timeout, spec.wait) == ("lora", "sglang", 90.0, 0.0)


@pytest.mark.slow
def test_the_readme_pool_setting_is_a_valid_instance_setting(tmp_path, repo_root):
    """docs/dagster.md: one collection at a time with `dagster instance concurrency set
    legato_collection 1` (dagster.yaml's pools take only default_limit): the command runs
    against the repository's dagster.yaml and the instance then limits the pool to 1."""
    import shutil
    import subprocess
    import sys

    readme = (repo_root / "docs" / "dagster.md").read_text()
    command = "dagster instance concurrency set legato_collection 1"
    assert command in readme and "`legato_collection: 1` in `dagster.yaml`" not in readme
    shutil.copy(repo_root / "dagster.yaml", tmp_path / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "dagster", *command.split()[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        info = instance.event_log_storage.get_concurrency_info("legato_collection")
        assert info.slot_count == 1


def _materialize_collection(instance_ref, version, tasks, act, delay, policy, lake) -> bool:
    """One collect run of the instance at ``instance_ref`` in its own process, as Dagster
    runs them (two in-process ``materialize`` calls on threads deadlock in ``logging``: Dagster
    re-runs ``logging.config.dictConfig`` per run while the other run's handlers log)."""
    import time

    time.sleep(delay)
    with dg.DagsterInstance.from_ref(instance_ref) as instance:
        result = dg.materialize(
            [ASSETS[0]],  # rollout_batch: the collection
            partition_key=version,
            instance=instance,
            resources={
                "policy": PolicyResource(**policy),
                "desktops": DesktopPoolResource(
                    backend="fake", desktops=1, options={"latency": {"act": act}}
                ),
                "lake": LakeResource(root=lake),
            },
            run_config={
                "ops": {"rollout_batch": {"config": {"tasks": tasks, "group": 2, "max_steps": 3}}}
            },
            raise_on_error=False,
        )
        return result.success


@pytest.mark.slow
def test_two_weights_runs_at_once_on_one_server_take_turns_under_dagster(tmp_path, no_policy_key):
    """Two collect runs of a real instance at once (the pool allows two), each in its own
    process as Dagster runs them, both load full weights into one server: the second waits for
    the first's collection (the server's weights lock), so every request of each run is
    answered by its own version's weights."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ckpts = tmp_path / "ckpts"
    for version in ("step-1", "step-2"):
        weights(ckpts, version)
    tasks = {}
    for label in ("a", "b"):
        tasks[label] = tmp_path / f"tasks-{label}.json"
        tasks[label].write_text(
            json.dumps(
                [
                    {
                        "task_id": f"{label}-{i}",
                        "config": {
                            "instruction": f"Task of run {label} number {i}.",
                            "fake": {"success": 0.5},
                        },
                    }
                    for i in range(2)
                ]
            )
        )
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with (
        ScriptedPolicyServer(flavor="sglang", record_bodies=True) as server,
        dg.DagsterInstance.from_config(str(home)) as instance,
    ):
        policy = dict(
            base_url=server.url, model=server.model, load="weights", checkpoint_root=str(ckpts)
        )
        instance.add_dynamic_partitions(policy_versions.name, ["step-1", "step-2"])
        lake = str(tmp_path / "lake")
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(2, mp_context=spawn) as pool:
            runs = {
                "step-1": pool.submit(
                    _materialize_collection,
                    instance.get_ref(),
                    "step-1",
                    str(tasks["a"]),
                    0.2,
                    0.0,
                    policy,
                    lake,
                ),
                "step-2": pool.submit(
                    _materialize_collection,
                    instance.get_ref(),
                    "step-2",
                    str(tasks["b"]),
                    0.0,
                    1.0,
                    policy,
                    lake,
                ),
            }
            assert runs["step-1"].result(timeout=300) and runs["step-2"].result(timeout=300)
        served = {}
        for r in server.chat_requests:
            label = r.body.split(b"Task of run ")[1][:1].decode()
            served.setdefault(label, set()).add(r.served)
        assert served == {"a": {"step-1"}, "b": {"step-2"}}


def test_a_missing_checkpoint_folder_names_the_path_looked_for(tmp_path):
    from legato_pipelines.errors import LoadError

    policy = PolicyResource(
        base_url="http://127.0.0.1:9", model="m", load="weights", checkpoint_root=str(tmp_path)
    )
    with pytest.raises(LoadError, match=rf"{tmp_path / 'step-7'} \(does not exist"):
        policy.load_spec("step-7")
