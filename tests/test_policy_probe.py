"""``probe`` and ``legato probe`` against real scripted servers of each flavor on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.policy import PolicyConfig, probe
from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

KEYS = {
    "reachable", "model_listed", "logprobs", "token_ids", "token_ids_source", "cached_tokens_reported",
    "max_images_ok", "reasoning_field", "latency_s", "usable_for_rl", "notes",
    "cache_block_size", "cached_tokens", "answer_field",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)


async def run_probe(flavor: str, faults: Faults | None = None, model: str | None = None):
    with ScriptedPolicyServer(flavor=flavor, faults=faults) as server:
        report = await probe(
            PolicyConfig(base_url=server.url, model=model or server.model, step_timeout=5)
        )
    return report, server


@pytest.mark.parametrize(
    ("flavor", "source", "reasoning"),
    [
        ("vllm", "choice.token_ids", "reasoning"),
        ("sglang", "choice.token_ids", "reasoning_content"),
        ("vllm-old", "logprobs.token_id_strings", "reasoning_content"),
        ("openai", None, None),
    ],
)
async def test_verdict_per_flavor(flavor, source, reasoning):
    report, server = await run_probe(flavor)
    assert report.reachable and report.model_listed
    assert report.logprobs and report.usable_for_rl
    assert report.token_ids is (source is not None) and report.token_ids_source == source
    assert report.reasoning_field == reasoning
    assert report.cached_tokens_reported is True
    assert report.max_images_ok == 20
    assert 0 < report.latency_s < 5
    notes = " ".join(report.notes)
    if flavor == "vllm-old":
        assert "returned no ids" in notes  # silent ignore detected, then the older way
    if flavor == "openai":
        assert "refused return_token_ids" in notes and "no token ids" in notes
    if flavor in ("vllm", "sglang"):
        assert report.notes == []
    # the same two-image prompt went out twice and the second one hit the cache
    cached = [r.cached_tokens for r in server.chat_requests if r.n_images == 2]
    assert cached[0] == 0 and cached[1] > 0


async def test_no_logprobs_not_usable():
    report, _ = await run_probe("vllm", Faults(no_logprobs=True))
    assert report.logprobs is False and report.usable_for_rl is False
    assert any("not usable for RL" in n for n in report.notes)


async def test_image_limit_and_cache_reporting_off():
    report, server = await run_probe("vllm", Faults(image_limit=5, cache_report=False))
    assert report.max_images_ok == 5
    assert any("--image-max 5" in n for n in report.notes)
    assert report.cached_tokens_reported is False
    assert any("--enable-prompt-tokens-details" in n for n in report.notes)
    assert report.usable_for_rl


async def test_image_limit_of_one_blocks_the_two_image_cache_check():
    report, _ = await run_probe("vllm-old", Faults(image_limit=1))
    assert report.max_images_ok == 1
    assert report.cached_tokens_reported is True  # re-checked with one image
    assert any("two images in one prompt were refused" in n for n in report.notes)


async def test_model_not_listed_and_unreachable():
    report, server = await run_probe("vllm", model="other")
    assert report.reachable and report.model_listed is False and not report.usable_for_rl
    assert "scripted-qwen" in report.notes[0]
    assert server.chat_requests == []
    report = await probe(PolicyConfig(base_url=server.url, model="x"))  # stopped by now
    assert report.reachable is False and "Connection refused" in report.notes[0]


def invoke(*args: str):
    return CliRunner().invoke(app, ["probe", *args])


def test_cli_json_and_exit_status():
    with ScriptedPolicyServer(flavor="sglang") as server:
        ok = invoke("--policy-url", server.url, "--model", server.model, "--json")
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert set(data) == KEYS and data["usable_for_rl"] is True
    assert data["reasoning_field"] == "reasoning_content"
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(no_logprobs=True)) as server:
        bad = invoke("--policy-url", server.url, "--model", server.model, "--json")
        table = invoke("--policy-url", server.url, "--model", server.model)
    assert bad.exit_code == 1 and json.loads(bad.stdout)["usable_for_rl"] is False
    assert (
        table.exit_code == 1 and "usable for RL" in table.stdout and "no logprobs" in table.stdout
    )
    with ScriptedPolicyServer(flavor="vllm") as server:
        unlisted = invoke("--policy-url", server.url, "--model", "not-served")
    assert unlisted.exit_code == 1 and "model not listed" in unlisted.stdout
    wrong = invoke("--policy-url", "localhost:8000", "--model", "m")
    assert wrong.exit_code == 2 and "--policy-url" in wrong.output
