"""Loading a policy version into the model server (``policy/loading.py``) through the engine,
against the real scripted server on loopback in its vLLM and SGLang flavors: adapters and full
weights are loaded before any desktop starts, every request names the weights that served it,
failures quote the server, ``external`` verifies, a changed checkpoint folder refuses a resume.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from legato_pipelines import PolicyConfig, collect, read_records
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.errors import ConfigError, LoadError, ResumeError
from legato_pipelines.policy.loading import LoadSpec, fingerprint, incomplete
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.engine_support import SECRET, fake_tasks

FAKE = DesktopConfig(backend="fake")


def adapter(root: Path, name: str, rank: int = 8) -> Path:
    """A LoRA adapter folder as PEFT writes one (small stand-in weights)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    (path / "adapter_model.safetensors").write_bytes(name.encode() * 64)
    return path


def weights(root: Path, name: str) -> Path:
    """A full-weights folder: config, a sharded safetensors index and its shards."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl", "name": name}))
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    for shard in shards:
        (path / shard).write_bytes(name.encode() * 128)
    return path


def _collect(server, out, version, load, **kw):
    policy = PolicyConfig(base_url=server.url, model=server.model, version=version)
    return collect(
        fake_tasks(2, success=0.5),
        policy,
        out,
        desktop=FAKE,
        desktops=2,
        group=2,
        max_steps=2,
        load=load,
        **kw,
    )


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_lora_each_version_loaded_before_collecting_and_serves_every_request(
    tmp_path, flavor, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    with ScriptedPolicyServer(flavor=flavor, runtime_lora=True) as server:
        for version in ("step-1", "step-2"):
            path = adapter(ckpts, version)
            before = len(server.chat_requests)
            _collect(
                server, tmp_path / version, version, LoadSpec(mode="lora", checkpoint=str(path))
            )
            served = {r.served for r in server.chat_requests[before:]}
            assert served == {version}  # every request of this run, and only these weights
            meta = json.loads((tmp_path / version / "run.json").read_text())
            entry = meta["checkpoint"]
            assert entry["load"] == "lora" and entry["server"] == flavor
            assert entry["path"] == str(path.resolve())
            assert entry["fingerprint"] == fingerprint(path)["digest"]
            assert entry["proof"]["kind"] in ("models_listing", "loaded_adapters")
            expected_model = version if flavor == "vllm" else f"{server.model}:{version}"
            assert meta["policy"]["model"] == entry["served_model"] == expected_model
            for record in read_records(tmp_path / version):
                assert record["policy"] == {
                    "model": expected_model,
                    "version": version,
                    "load": "lora",
                    "checkpoint": str(path.resolve()),
                    "fingerprint": entry["fingerprint"],
                    "cache_salt": entry["cache_salt"],
                }
            # every request carried the checkpoint's salt (no cache of other weights)
            assert {r.cache_salt for r in server.chat_requests[before:]} == {entry["cache_salt"]}
        # The adapter was loaded before the first chat request of its run.
        assert [name for _, name, _ in server.loads] == ["step-1", "step-2"]


def test_lora_keeps_only_the_newest_adapters_of_the_checkpoints_directory(tmp_path, no_policy_key):
    ckpts = tmp_path / "ckpts"
    other = adapter(tmp_path / "elsewhere", "team-adapter")
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        server.adapters["team-adapter"] = str(other)  # loaded by someone else: never unloaded
        for i in range(1, 4):
            path = adapter(ckpts, f"step-{i}")
            _collect(
                server,
                tmp_path / f"run-{i}",
                f"step-{i}",
                LoadSpec(mode="lora", checkpoint=str(path), keep=2),
            )
        assert list(server.adapters) == ["team-adapter", "step-2", "step-3"]
        proof = json.loads((tmp_path / "run-3" / "run.json").read_text())["checkpoint"]["proof"]
        assert proof["unloaded"] == ["step-1"]


@pytest.mark.parametrize(
    ("flavor", "route"),
    [("sglang", None), ("vllm", "/update_weights"), ("vllm", "/load_checkpoint")],
)
def test_full_weights_loaded_and_proven(tmp_path, flavor, route, no_policy_key):
    ckpts = tmp_path / "ckpts"
    spec = {} if route is None else {"weights_route": route}
    with ScriptedPolicyServer(flavor=flavor, weights_route=route) as server:
        for version in ("step-1", "step-2"):
            path = weights(ckpts, version)
            before = len(server.chat_requests)
            _collect(
                server,
                tmp_path / version,
                version,
                LoadSpec(mode="weights", checkpoint=str(path), **spec),
            )
            assert {r.served for r in server.chat_requests[before:]} == {version}
            entry = json.loads((tmp_path / version / "run.json").read_text())["checkpoint"]
            assert entry["served_model"] == server.model  # full weights: the base id is called
            kind = "model_path" if flavor == "sglang" else "route_reported_path"
            assert entry["proof"]["kind"] == kind  # the scripted route echoes model_path


def test_runtime_lora_refused_without_the_variable_names_the_server_answer(
    tmp_path, monkeypatch, no_policy_key
):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    path = adapter(tmp_path / "ckpts", "step-1")
    with ScriptedPolicyServer(flavor="vllm") as server:
        with pytest.raises(LoadError) as info:
            _collect(
                server, tmp_path / "run", "step-1", LoadSpec(mode="lora", checkpoint=str(path))
            )
        message = str(info.value)
        assert "HTTP 404" in message and "Not Found" in message
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in message
        assert server.chat_requests == []  # nothing was collected
        assert not (tmp_path / "run" / "rollouts.jsonl").exists()
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    with ScriptedPolicyServer(flavor="vllm") as server:  # reads the variable as vLLM does
        _collect(server, tmp_path / "run", "step-1", LoadSpec(mode="lora", checkpoint=str(path)))
        assert {r.served for r in server.chat_requests} == {"step-1"}


def test_load_failures_quote_the_server_and_collect_nothing(tmp_path, no_policy_key):
    ckpts = tmp_path / "ckpts"
    broken = ckpts / "step-9"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")
    (broken / "adapter_config.json").write_text("{}")
    with ScriptedPolicyServer(flavor="sglang", enable_lora=False) as server:
        with pytest.raises(
            LoadError,
            match=r"/load_lora_adapter answered HTTP 400: LoRA is not enabled.*--enable-lora",
        ):
            _collect(
                server, tmp_path / "a", "step-9", LoadSpec(mode="lora", checkpoint=str(broken))
            )
        assert server.chat_requests == []
    with ScriptedPolicyServer(flavor="vllm") as server:  # stock vLLM: no full-weights route
        with pytest.raises(LoadError, match=r"/update_weights answered HTTP 404.*--weights-route"):
            _collect(
                server, tmp_path / "b", "step-9", LoadSpec(mode="weights", checkpoint=str(broken))
            )
    with pytest.raises(ConfigError, match="no adapter_config.json.*--load weights"):
        _collect(
            server,
            tmp_path / "c",
            "step-1",
            LoadSpec(mode="lora", checkpoint=str(weights(ckpts, "step-1"))),
        )
    with pytest.raises(ConfigError, match="--checkpoint"):
        _collect(server, tmp_path / "d", "step-1", LoadSpec(mode="weights"))


def test_external_verifies_and_refuses_when_the_version_is_not_served(tmp_path, no_policy_key):
    path = adapter(tmp_path / "ckpts", "step-5")
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        with pytest.raises(
            LoadError, match=r"does not serve version 'step-5': /v1/models lists scripted-qwen"
        ):
            _collect(
                server, tmp_path / "run", "step-5", LoadSpec(mode="external", checkpoint=str(path))
            )
        assert server.chat_requests == [] and not (tmp_path / "run").exists()
        # The trainer loads it itself; the run verifies and calls it.
        httpx.post(
            f"{server.url}/v1/load_lora_adapter",
            json={"lora_name": "step-5", "lora_path": str(path)},
        )
        _collect(
            server, tmp_path / "run", "step-5", LoadSpec(mode="external", checkpoint=str(path))
        )
        assert {r.served for r in server.chat_requests} == {"step-5"}
        entry = json.loads((tmp_path / "run" / "run.json").read_text())["checkpoint"]
        assert entry["proof"]["kind"] == "models_listing" and entry["served_model"] == "step-5"
    full = weights(tmp_path / "ckpts", "step-6")
    with ScriptedPolicyServer(flavor="sglang") as server:  # a trainer synced full weights
        server._set_weights("/update_weights_from_disk", str(full))
        _collect(
            server, tmp_path / "run6", "step-6", LoadSpec(mode="external", checkpoint=str(full))
        )
        assert {r.served for r in server.chat_requests} == {"step-6"}


def test_none_is_named_and_recorded(tmp_path, policy_server, no_policy_key):
    _collect(policy_server, tmp_path / "run", "step-1", LoadSpec())
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["checkpoint"]["load"] == "none" and meta["checkpoint"]["proof"]["kind"] == "none"
    assert read_records(tmp_path / "run")[0]["policy"] == {
        "model": policy_server.model,
        "version": "step-1",
        "load": "none",
    }


def test_resume_after_the_checkpoint_folder_changed_is_refused(tmp_path, no_policy_key):
    path = adapter(tmp_path / "ckpts", "step-1")
    spec = LoadSpec(mode="lora", checkpoint=str(path))
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        _collect(server, tmp_path / "run", "step-1", spec, collected_by="session-1")
        records = read_records(tmp_path / "run")
        assert {r["collected_by"] for r in records} == {"session-1"}
        _collect(server, tmp_path / "run", "step-1", spec)  # same folder: resumes (nothing left)
        assert len(read_records(tmp_path / "run")) == len(records)
        (path / "adapter_model.safetensors").write_bytes(b"retrained" * 100)
        loads = len(server.loads)
        with pytest.raises(ResumeError, match="the checkpoint folder changed"):
            _collect(server, tmp_path / "run", "step-1", spec)
        assert len(server.loads) == loads  # refused before anything was loaded


def test_fingerprint_and_completeness(tmp_path):
    path = weights(tmp_path, "step-1")
    first = fingerprint(path)
    assert first["files"]["config.json"]["sha256"]
    assert "sha256" not in first["files"]["model-00001-of-00002.safetensors"]  # shards: size only
    assert fingerprint(path) == first
    (path / "config.json").write_text(json.dumps({"model_type": "other"}))
    assert fingerprint(path)["digest"] != first["digest"]
    assert incomplete(path) is None
    (path / "model-00002-of-00002.safetensors").unlink()
    assert "missing shard" in incomplete(path)
    empty = tmp_path / "step-2"
    empty.mkdir()
    assert incomplete(empty) is None  # an empty folder may be a version marker
    (empty / "adapter_model.safetensors.tmp").write_bytes(b"x")
    assert "still being written" in incomplete(empty)


def test_policy_key_goes_to_load_routes_never_into_records(tmp_path, monkeypatch):
    monkeypatch.setenv("LEGATO_POLICY_KEY", SECRET)
    path = adapter(tmp_path / "ckpts", "step-1")
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True, api_key=SECRET) as server:
        _collect(server, tmp_path / "run", "step-1", LoadSpec(mode="lora", checkpoint=str(path)))
        loads = [r for r in server.requests if r.path == "/v1/load_lora_adapter"]
        assert loads and all(r.authorized for r in loads)
    for file in (tmp_path / "run").rglob("*.json*"):
        assert SECRET not in file.read_text()


def test_scripted_routes_speak_each_flavor(tmp_path):
    path = adapter(tmp_path, "a1")
    with ScriptedPolicyServer(flavor="sglang") as server:
        answer = httpx.post(
            f"{server.url}/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(path)}
        )
        assert answer.json() == {
            "success": True,
            "error_message": "",
            "loaded_adapters": {"a1": str(path)},
        }
        again = httpx.post(
            f"{server.url}/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(path)}
        )
        assert again.status_code == 400 and "already loaded" in again.json()["error_message"]
        assert httpx.post(f"{server.url}/v1/load_lora_adapter", json={}).status_code == 404
        assert httpx.get(f"{server.url}/get_model_info").json()["model_path"] == server.model
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        assert httpx.post(f"{server.url}/load_lora_adapter", json={}).status_code == 404
        assert httpx.get(f"{server.url}/get_model_info").status_code == 404
        missing = httpx.post(
            f"{server.url}/v1/load_lora_adapter",
            json={"lora_name": "x", "lora_path": str(tmp_path / "nope")},
        )
        assert (
            missing.status_code == 404 and "No adapter found" in missing.json()["error"]["message"]
        )
        ok = httpx.post(
            f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(path)}
        )
        assert ok.status_code == 200 and "added successfully" in ok.json()
        models = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert {"id": "a1", "root": str(path), "parent": server.model}.items() <= models[1].items()
        gone = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "a1"})
        assert gone.status_code == 200
    asyncio.run(asyncio.sleep(0))


@pytest.mark.slow
def test_legato_collect_load_flags(tmp_path, no_policy_key):
    from tests.test_engine_cli import collect_args, legato, write_tasks

    tasks = write_tasks(tmp_path / "tasks.json", 2)
    path = adapter(tmp_path / "ckpts", "step-3")
    with ScriptedPolicyServer(flavor="vllm") as server:  # no runtime LoRA: refused, exit 2
        out = legato(
            *collect_args(server, tasks, tmp_path / "a", "--load", "lora", "--checkpoint", path)
        )
        assert out.returncode == 2, out.stderr
        assert "/v1/load_lora_adapter answered HTTP 404" in out.stderr
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in out.stderr
        assert server.chat_requests == []
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        args = collect_args(
            server, tasks, tmp_path / "b", "--load", "lora", "--checkpoint", path, "--group", "1"
        )
        out = legato(*args)
        assert out.returncode == 0, out.stderr
        assert server.chat_requests and {r.served for r in server.chat_requests} == {"step-3"}
        assert json.loads((tmp_path / "b" / "run.json").read_text())["checkpoint"]["load"] == "lora"
        bad = legato(*collect_args(server, tasks, tmp_path / "c", "--load", "sideways"))
        assert bad.returncode == 2 and "--load" in bad.stderr


def test_completeness_of_folders_a_trainer_is_still_writing(tmp_path):
    path = weights(tmp_path, "step-1")
    (path / "model.safetensors.index.json").unlink()  # the index comes after the shards
    assert incomplete(path) == ("model-*-of-00002.safetensors shards without their index file yet")
    config_only = tmp_path / "step-2"
    config_only.mkdir()
    (config_only / "config.json").write_text("{}")
    assert incomplete(config_only).startswith("config.json without model weights yet")
    (config_only / "model.safetensors").write_bytes(b"w")
    assert incomplete(config_only) is None


def test_server_kinds_come_from_one_loader_table(tmp_path, no_policy_key):
    """``--load-server``'s choices are ``auto`` and the kinds of the loader table, one loader
    class per kind; ``auto`` asks each kind's identifying route of the real server."""
    from typing import get_args

    from legato_pipelines.policy.load_spec import LoadPlan, ServerKind
    from legato_pipelines.policy.loaders import LOADERS, ServerLoader, detect_kind

    assert get_args(ServerKind) == ("auto", *LOADERS)
    assert all(issubclass(cls, ServerLoader) and cls.kind == k for k, cls in LOADERS.items())
    for flavor, kind in (("sglang", "sglang"), ("vllm", "vllm")):
        with ScriptedPolicyServer(flavor=flavor) as server:
            plan = LoadPlan(LoadSpec(), "v1", None, "m", "m", None, None, root=server.url)
            assert asyncio.run(detect_kind(plan)) == kind
