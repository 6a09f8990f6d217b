"""``checkpoint_sensor`` on real directories and a real model server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import dagster as dg
import pytest

from legato_pipelines.assets import policy_versions
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.resources import CheckpointSourceResource, PolicyResource
from legato_pipelines.sensors.checkpoints import MAX_PER_TICK
from tests.dagster_support import sensor_tick

POLICY = PolicyResource(base_url="http://127.0.0.1:9", model="unused")


def _evaluate(instance, cursor, checkpoints, policy=POLICY):
    return sensor_tick(instance, cursor, checkpoints, policy)


def _age(path, seconds: float = 120) -> None:
    """Make ``path`` and everything in it look written ``seconds`` ago (an old checkpoint)."""
    when = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (when, when))


def test_new_step_folder_adds_partition_and_requests_one_run(tmp_path):
    (tmp_path / "step-7").mkdir()
    (tmp_path / "notes").mkdir()  # does not match step-*
    (tmp_path / "step-9.tmp").write_text("a file, not a folder")
    source = CheckpointSourceResource(directory=str(tmp_path))
    with dg.instance_for_test() as instance:
        # Just written: the first tick records its sizes, the second (unchanged) requests it.
        settling = _evaluate(instance, None, source)
        assert settling.run_requests == [] and "waiting: step-7 (sizes recorded" in (
            settling.skip_reason.skip_message
        )
        first = _evaluate(instance, settling.cursor, source)
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
        _age(tmp_path / "step-8")  # written long ago: counts at once
        third = _evaluate(instance, first.cursor, source)
        assert [r.partition_key for r in third.run_requests] == ["step-8"]


def test_existing_partition_is_not_added_again(tmp_path):
    (tmp_path / "step-1").mkdir()
    source = CheckpointSourceResource(directory=str(tmp_path), stable_s=0)  # complete: counts
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
        result = _evaluate(instance, None, source)
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


@pytest.mark.slow
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
def test_models_source_says_what_to_fix_when_the_server_refuses_or_is_down():
    """A wrong key (401) or no server: the skip reason is the CLI's message (``fix: set
    LEGATO_POLICY_KEY`` / ``fix --policy-url``), never a raw httpx traceback, never the key."""
    source = CheckpointSourceResource(source="models", pattern="*")
    with ScriptedPolicyServer(flavor="vllm", model="org/lora-1", api_key="k-right") as server:
        policy = PolicyResource(base_url=server.url, model="base", api_key="k-wrong-secret")
        with dg.instance_for_test() as instance:
            refused = _evaluate(instance, None, source, policy)
        url = server.url
    assert isinstance(refused, dg.SkipReason), refused
    assert "refused the API key (HTTP 401)" in refused.skip_message
    assert "(fix: set LEGATO_POLICY_KEY)" in refused.skip_message
    assert "k-wrong-secret" not in refused.skip_message and "k-right" not in refused.skip_message
    down = PolicyResource(base_url=url, model="base")  # the server has stopped
    with dg.instance_for_test() as instance:
        unreachable = _evaluate(instance, None, source, down)
    assert isinstance(unreachable, dg.SkipReason), unreachable
    assert f"cannot reach the policy server at {url}" in unreachable.skip_message
    assert "fix --policy-url" in unreachable.skip_message
    assert "(in Dagster: LEGATO_POLICY_URL / the policy resource's base_url)" in (
        unreachable.skip_message
    )


@pytest.mark.slow
def test_sensor_preview_cli_shows_exactly_one_run(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "step-7").mkdir(parents=True)
    _age(checkpoints / "step-7")
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


def test_a_checkpoint_still_being_written_waits_until_complete_and_stable(tmp_path):
    # Default settings, no marker: a run must never start on a half-written checkpoint.
    source = CheckpointSourceResource(directory=str(tmp_path))
    single = tmp_path / "step-1"  # one weights file written in place (no .tmp name)
    single.mkdir()
    (single / "config.json").write_text("{}")
    sharded = tmp_path / "step-2"  # the trainer writes shards first, the index last
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    (sharded / "model-00001-of-00002.safetensors").write_bytes(b"w" * 64)
    lora = tmp_path / "step-3"
    lora.mkdir()
    (lora / "adapter_config.json").write_text("{}")
    with dg.instance_for_test() as instance:
        tick = _evaluate(instance, None, source)
        text = tick.skip_message
        assert "step-1 (config.json without model weights yet" in text
        assert "step-2 (model-*-of-00002.safetensors shards without their index file yet)" in text
        assert "step-3 (adapter_config.json without adapter_model.* weights)" in text
        with open(single / "model.safetensors", "wb") as f:
            f.write(b"w" * 1000)
            f.flush()
            tick = _evaluate(instance, None, source)  # a tick while the file is being written
            assert tick.run_requests == []
            assert "step-1 (sizes recorded" in tick.skip_reason.skip_message
            f.write(b"w" * 1000)
        tick = _evaluate(instance, tick.cursor, source)  # grew since the last tick
        assert tick.run_requests == []
        assert "step-1 (sizes still changing since the last tick)" in tick.skip_reason.skip_message
        tick = _evaluate(instance, tick.cursor, source)  # unchanged over two ticks: counts
        assert [r.partition_key for r in tick.run_requests] == ["step-1"]
        cursor = tick.cursor

        (sharded / "model-00002-of-00002.safetensors").write_bytes(b"w" * 64)
        index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                                "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
        (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
        (lora / "adapter_model.safetensors").write_bytes(b"a" * 64)
        tick = _evaluate(instance, cursor, source)
        assert tick.run_requests == []  # complete now, sizes recorded
        tick = _evaluate(instance, tick.cursor, source)
        assert [r.partition_key for r in tick.run_requests] == ["step-2", "step-3"]
        assert json.loads(tick.cursor) == {
            "requested": ["step-1", "step-2", "step-3"],
            "sizes": {},
        }
        assert (
            "no new policy version (3 known)"
            in _evaluate(instance, tick.cursor, source).skip_message
        )


def test_an_older_list_cursor_still_counts_as_requested(tmp_path):
    (tmp_path / "step-1").mkdir()
    _age(tmp_path / "step-1")
    source = CheckpointSourceResource(directory=str(tmp_path))
    with dg.instance_for_test() as instance:
        result = _evaluate(instance, json.dumps(["step-1"]), source)
        assert isinstance(result, dg.SkipReason) and "no new policy version" in (
            result.skip_message
        )


def test_a_folder_that_cannot_be_a_version_is_skipped_and_the_others_run(tmp_path):
    for name in ("step-4", "step-5_lr=3e-6"):
        (tmp_path / name).mkdir()
        _age(tmp_path / name)
    source = CheckpointSourceResource(directory=str(tmp_path))
    with dg.instance_for_test() as instance:
        result = _evaluate(instance, None, source)
        assert [r.partition_key for r in result.run_requests] == ["step-4"]
        assert instance.get_dynamic_partitions(policy_versions.name) == ["step-4"]
        skip = _evaluate(instance, result.cursor, source)
        assert isinstance(skip, dg.SkipReason)
        text = skip.skip_message
        assert text.startswith(f"skipped: step-5_lr=3e-6 (folder {tmp_path / 'step-5_lr=3e-6'}: ")
        assert "'=' cannot be in a version key" in text
        assert "(fix: use 'step-5_lr-3e-6'); rename it)" in text


def test_a_model_id_that_cannot_be_a_version_is_skipped_and_the_others_run():
    with ScriptedPolicyServer(flavor="vllm", model="base", runtime_lora=True) as server:
        server.adapters["org/policy_lr=3e-6"] = "/ckpt/a"
        server.adapters["org/policy-2"] = "/ckpt/b"
        policy = PolicyResource(base_url=server.url, model="base")
        source = CheckpointSourceResource(source="models", pattern="org/*")
        with dg.instance_for_test() as instance:
            result = _evaluate(instance, None, source, policy)
            assert [r.partition_key for r in result.run_requests] == ["org--policy-2"]
            skip = _evaluate(instance, result.cursor, source, policy)
            assert "skipped: org/policy_lr=3e-6 (model id 'org/policy_lr=3e-6': " in (
                skip.skip_message
            )
            assert "(fix: use 'org--policy_lr-3e-6')" in skip.skip_message


@pytest.mark.parametrize("load", ["lora", "weights"])
def test_a_folder_counts_only_once_it_holds_what_the_load_mode_loads(tmp_path, load):
    """PEFT writes adapter_model.safetensors before adapter_config.json; a full-weights folder
    may hold config.json and one shard before the rest; an empty folder holds nothing; a
    folder under a temporary name is renamed later. None of them becomes a version (a run
    requested too early would fail to load, and a version is requested once), and one such
    folder holds up no other."""
    policy = PolicyResource(base_url="http://127.0.0.1:9", model="unused", load=load)
    half = tmp_path / "step-1"
    half.mkdir()
    if load == "lora":
        (half / "adapter_model.safetensors").write_bytes(b"w" * 64)
    else:
        (half / "config.json").write_text("{}")
        (half / "model-00001-of-00002.safetensors").write_bytes(b"w")
    (tmp_path / "step-2").mkdir()  # empty
    for temporary in ("step-5.tmp", "step-6.partial"):
        (tmp_path / temporary).mkdir()
        (tmp_path / temporary / "adapter_config.json").write_text("{}")
        (tmp_path / temporary / "adapter_model.safetensors").write_bytes(b"w")
        (tmp_path / temporary / "config.json").write_text("{}")
        (tmp_path / temporary / "model.safetensors").write_bytes(b"w")
    done = tmp_path / "step-3"
    done.mkdir()
    if load == "lora":
        (done / "adapter_config.json").write_text("{}")
        (done / "adapter_model.safetensors").write_bytes(b"w")
    else:
        (done / "config.json").write_text("{}")
        (done / "model.safetensors").write_bytes(b"w")
    source = CheckpointSourceResource(directory=str(tmp_path), stable_s=0)
    with dg.instance_for_test() as instance:
        first = _evaluate(instance, None, source, policy)
        assert [r.partition_key for r in first.run_requests] == ["step-3"]
        assert instance.get_dynamic_partitions(policy_versions.name) == ["step-3"]
        skip = _evaluate(instance, first.cursor, source, policy)
        message = skip.skip_message
        need = "adapter_config.json" if load == "lora" else "config.json"
        assert f"step-2 (no {need} yet" in message
        assert "step-5.tmp (a temporary name: counts once renamed)" in message
        assert "step-6.partial (a temporary name" in message
        assert "step-1 (" in message
        # the trainer finishes step-1: requested now, once
        if load == "lora":
            (half / "adapter_config.json").write_text("{}")
        else:
            (half / "model-00002-of-00002.safetensors").write_bytes(b"w")
            index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
            index["weight_map"]["b"] = "model-00002-of-00002.safetensors"
            (half / "model.safetensors.index.json").write_text(json.dumps(index))
        later = _evaluate(instance, first.cursor, source, policy)
        assert [r.partition_key for r in later.run_requests] == ["step-1"]
        (tmp_path / "step-5.tmp").rename(tmp_path / "step-5")
        renamed = _evaluate(instance, later.cursor, source, policy)
        assert [r.partition_key for r in renamed.run_requests] == ["step-5"]
