"""Checkpoints reach the model server through Dagster: the real checkpoint sensor on a real
instance sees ``step-1`` and ``step-2``, each of its run requests is materialized for real
(fake desktops, the scripted server on loopback in vLLM and SGLang flavors), each run loads its
checkpoint before collecting, every request of the ``step-2`` run is answered by the ``step-2``
weights, and the lake rows carry the served model, the checkpoint path and its fingerprint.
Failures fail the run before any desktop starts, with the server's words, visible on the run.
"""

from __future__ import annotations

import json
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
from legato_pipelines.sensors import checkpoint_sensor
from legato_pipelines.store.lake import Lake
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
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"checkpoints": source, "policy": policy}
    )
    result = checkpoint_sensor(context)
    if isinstance(result, dg.SensorResult):
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(
                request.partitions_def_name, list(request.partition_keys)
            )
    return result


def _run(instance, request, policy, lake_root, tasks_file, raise_on_error=True):
    """Materialize what a sensor's run request asks for, as the daemon would launch it."""
    run_config = {
        "ops": {"rollout_batch": {"config": {"tasks": str(tasks_file), "group": 2, "max_steps": 2}}}
    }
    return dg.materialize(
        ASSETS,
        partition_key=request.partition_key,
        instance=instance,
        tags=request.tags,
        resources={
            "policy": policy,
            "desktops": DesktopPoolResource(backend="fake", desktops=2),
            "lake": LakeResource(root=str(lake_root)),
        },
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


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
