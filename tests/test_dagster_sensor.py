"""``checkpoint_sensor`` on real directories and a real model server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import pytest

from legato_pipelines.assets import policy_versions
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.resources import CheckpointSourceResource, PolicyResource
from legato_pipelines.sensors import checkpoint_sensor
from legato_pipelines.sensors.checkpoints import MAX_PER_TICK

POLICY = PolicyResource(base_url="http://127.0.0.1:9", model="unused")


def _evaluate(instance, cursor, checkpoints, policy=POLICY):
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"checkpoints": checkpoints, "policy": policy}
    )
    result = checkpoint_sensor(context)
    if isinstance(result, dg.SensorResult):
        # What the daemon does with the result: add the partitions.
        for request in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(
                request.partitions_def_name, list(request.partition_keys)
            )
    return result


def test_new_step_folder_adds_partition_and_requests_one_run(tmp_path):
    (tmp_path / "step-7").mkdir()
    (tmp_path / "notes").mkdir()  # does not match step-*
    (tmp_path / "step-9.tmp").write_text("a file, not a folder")
    source = CheckpointSourceResource(directory=str(tmp_path))
    with dg.instance_for_test() as instance:
        first = _evaluate(instance, None, source)
        assert isinstance(first, dg.SensorResult)
        assert [(r.partition_key, r.run_key) for r in first.run_requests] == [("step-7", "step-7")]
        assert first.run_requests[0].tags["legato/checkpoint"] == str(tmp_path / "step-7")
        [add] = first.dynamic_partitions_requests
        assert (add.partitions_def_name, list(add.partition_keys)) == (
            policy_versions.name,
            ["step-7"],
        )
        assert instance.get_dynamic_partitions(policy_versions.name) == ["step-7"]

        second = _evaluate(instance, first.cursor, source)
        assert isinstance(second, dg.SkipReason)

        (tmp_path / "step-8").mkdir()
        third = _evaluate(instance, first.cursor, source)
        assert [r.partition_key for r in third.run_requests] == ["step-8"]


def test_existing_partition_is_not_added_again(tmp_path):
    (tmp_path / "step-1").mkdir()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
        result = _evaluate(instance, None, CheckpointSourceResource(directory=str(tmp_path)))
        assert [r.partition_key for r in result.run_requests] == ["step-1"]
        assert result.dynamic_partitions_requests == []


def test_ready_marker_and_custom_glob(tmp_path):
    (tmp_path / "ckpt-2").mkdir()
    (tmp_path / "step-3").mkdir()
    source = CheckpointSourceResource(
        directory=str(tmp_path), pattern="ckpt-*", ready_marker="READY"
    )
    with dg.instance_for_test() as instance:
        assert isinstance(_evaluate(instance, None, source), dg.SkipReason)  # half-written
        (tmp_path / "ckpt-2" / "READY").write_text("")
        result = _evaluate(instance, None, source)
        assert [r.partition_key for r in result.run_requests] == ["ckpt-2"]


def test_missing_directory_skips(tmp_path):
    with dg.instance_for_test() as instance:
        result = _evaluate(
            instance, None, CheckpointSourceResource(directory=str(tmp_path / "nope"))
        )
        assert isinstance(result, dg.SkipReason) and "does not exist" in result.skip_message


def test_many_old_checkpoints_are_requested_a_tick_at_a_time(tmp_path):
    for i in range(MAX_PER_TICK + 5):
        path = tmp_path / f"step-{i}"
        path.mkdir()
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    source = CheckpointSourceResource(directory=str(tmp_path))
    with dg.instance_for_test() as instance:
        first = _evaluate(instance, None, source)
        assert [r.partition_key for r in first.run_requests] == [
            f"step-{i}" for i in range(MAX_PER_TICK)
        ]
        second = _evaluate(instance, first.cursor, source)
        assert [r.partition_key for r in second.run_requests] == [
            f"step-{i}" for i in range(MAX_PER_TICK, MAX_PER_TICK + 5)
        ]
        assert isinstance(_evaluate(instance, second.cursor, source), dg.SkipReason)


def test_models_source_requests_new_model_ids_with_the_model_in_run_config():
    with ScriptedPolicyServer(
        flavor="vllm", model="org/policy-lora-12", api_key="k-sensor"
    ) as server:
        policy = PolicyResource(base_url=server.url, model="base", api_key="k-sensor")
        source = CheckpointSourceResource(source="models", pattern="*lora*")
        with dg.instance_for_test() as instance:
            result = _evaluate(instance, None, source, policy)
            [request] = result.run_requests
            assert request.partition_key == "org--policy-lora-12"
            assert request.run_config == {
                "ops": {"rollout_batch": {"config": {"model": "org/policy-lora-12"}}}
            }
            assert isinstance(_evaluate(instance, result.cursor, source, policy), dg.SkipReason)
            other = CheckpointSourceResource(source="models", pattern="base-*")
            assert isinstance(_evaluate(instance, None, other, policy), dg.SkipReason)


@pytest.mark.slow
def test_sensor_preview_cli_shows_exactly_one_run(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "step-7").mkdir(parents=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "LEGATO_CHECKPOINTS": str(checkpoints)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dagster",
            "sensor",
            "preview",
            "checkpoint_sensor",
            "-m",
            "legato_pipelines.definitions",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "returning run requests for 1 run(s)" in out.stdout
    assert "new policy versions: step-7" in out.stdout + out.stderr
