"""The scripted policy server over real HTTP on 127.0.0.1: format, script lookup, synthetic
tokens, prefix-cache accounting, flavors, faults, and the CLI in the foreground."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from legato_pipelines.images import Screenshot
from legato_pipelines.policy.probe import probe_images
from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer
from legato_pipelines.policy.synthetic import SyntheticTokenizer, default_responses

TOOL_CALL = re.compile(r"^Action: (.+)\n<tool_call>\n(.+)\n</tool_call>$", re.S)


def chat(server: ScriptedPolicyServer, messages: list, **fields) -> httpx.Response:
    body = {
        "model": server.model,
        "messages": messages,
        "logprobs": True,
        "top_logprobs": 0,
        **fields,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10)


def user(text: str, shots: list[Screenshot] = ()) -> dict:
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": s.data_url.decode()}} for s in shots]
    return {"role": "user", "content": parts}


def episode(server, instruction: str, steps: int) -> list[str]:
    """Drive ``steps`` steps, appending each answer as an assistant message."""
    messages = [{"role": "system", "content": "You are a computer-use agent."}, user(instruction)]
    out = []
    for _ in range(steps):
        resp = chat(server, messages)
        assert resp.status_code == 200, resp.text
        content = resp.json()["choices"][0]["message"]["content"]
        out.append(content)
        messages += [{"role": "assistant", "content": content}, user("next screenshot")]
    return out


@pytest.fixture
def vllm():
    with ScriptedPolicyServer(flavor="vllm") as server:
        yield server


def test_models_health_and_not_a_model(vllm):
    models = httpx.get(vllm.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["scripted-qwen"]
    assert "not a model" in models["data"][0]["owned_by"]
    assert httpx.get(vllm.url + "/health").status_code == 200
    assert vllm.url.startswith("http://127.0.0.1:") and vllm.port > 0


def test_default_script_is_qwen_format_deterministic_and_terminates(vllm):
    instruction = "Rename the file report.docx to final.docx"
    answers = episode(vllm, instruction, 8)
    expected = default_responses(instruction)
    assert 2 <= len(expected) <= 6
    assert answers[: len(expected)] == expected  # step index = assistant messages in the request
    for text in answers:
        match = TOOL_CALL.match(text)
        assert match, text
        call = json.loads(match.group(2))
        assert call["name"] == "computer_use"
        if call["arguments"]["action"] == "left_click":
            assert all(0 <= c <= 999 for c in call["arguments"]["coordinate"])
    last = json.loads(TOOL_CALL.match(expected[-1]).group(2))["arguments"]
    assert last == {"action": "terminate", "status": "success"}
    assert all("terminate" not in e for e in expected[:-1])
    assert answers[len(expected) :] == [expected[-1]] * (8 - len(expected))  # past the end: repeat
    assert default_responses("another task entirely") != expected


def test_script_file_matched_by_instruction_substring(tmp_path):
    script = {
        "tasks": {
            "open the spreadsheet": ["A0", {"content": "A1", "reasoning": "thinking about A"}],
            "open the spreadsheet and sum column B": ["B0", "B1", "B2"],
        },
        "default": ["D0"],
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    with ScriptedPolicyServer(flavor="vllm", script=path) as server:
        assert episode(server, "Please open the spreadsheet now.", 3) == ["A0", "A1", "A1"]
        assert episode(server, "Please open the spreadsheet and sum column B.", 3) == [
            "B0",
            "B1",
            "B2",
        ]
        assert episode(server, "Something unscripted", 2) == ["D0", "D0"]
        messages = [user("open the spreadsheet"), {"role": "assistant", "content": "A0"}]
        msg = chat(server, messages).json()["choices"][0]["message"]
        assert msg["reasoning"] == "thinking about A" and msg["content"] == "A1"
    with pytest.raises(ValueError, match="tasks"):
        ScriptedPolicyServer(script={"tasks": {"x": []}})
    with pytest.raises(ValueError, match="unknown keys"):
        ScriptedPolicyServer(script={"task": {}})


def test_sample_order_cycle_gives_every_option_in_turn_per_task_and_step():
    """``sample_order="cycle"`` (``legato demo``): unseeded requests for the same task and step
    get a sample entry's options in turn, so a group of as many attempts sees each one; another
    task's entry keeps its own turn; ``random`` stays the default."""
    script = {"tasks": {"mixed task": [{"sample": ["right", "give up"]}, "next"],
                        "other task": [{"sample": ["x", "y"]}]}}  # fmt: skip
    with ScriptedPolicyServer(flavor="vllm", script=script, sample_order="cycle") as server:
        firsts = [episode(server, "the mixed task", 1)[0] for _ in range(4)]
        assert firsts == ["right", "give up", "right", "give up"]
        assert episode(server, "the other task", 1) == ["x"]
        assert episode(server, "the mixed task", 2) == ["right", "next"]
    assert ScriptedPolicyServer(script=script).sample_order == "random"
    with pytest.raises(ValueError, match="sample_order"):
        ScriptedPolicyServer(script=script, sample_order="roundrobin")


@pytest.mark.parametrize("flavor", ["vllm", "vllm-old", "sglang", "openai"])
def test_synthetic_tokens_join_to_content(flavor):
    with ScriptedPolicyServer(flavor=flavor) as server:
        body = chat(server, [user("Type hello into the search box")]).json()
    choice = body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    assert all(e["logprob"] < 0 for e in entries)
    assert all(bytes(e["bytes"]) == e["token"].encode() for e in entries)
    assert body["usage"]["completion_tokens"] == len(entries)
    tok = SyntheticTokenizer()
    assert "".join(tok.tokenize(" a\tb  c!\n\nxyzxyzxyzxyz ")) == " a\tb  c!\n\nxyzxyzxyzxyz "


def test_wire_shapes_per_flavor():
    msgs = [user("Click OK")]
    with ScriptedPolicyServer(flavor="vllm") as s:
        b = chat(s, msgs, return_token_ids=True).json()
        ids = b["choices"][0]["token_ids"]
        assert (
            isinstance(b["prompt_token_ids"], list)
            and len(b["prompt_token_ids"]) == b["usage"]["prompt_tokens"]
        )
        assert len(ids) == b["usage"]["completion_tokens"]
        assert "reasoning" in b["choices"][0]["message"]
        again = chat(s, msgs, return_token_ids=True).json()
        assert again["choices"][0]["token_ids"] == ids  # deterministic
        plain = chat(s, [user("Something new")]).json()
        assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
        strings = chat(s, msgs, return_tokens_as_token_ids=True).json()["choices"][0]["logprobs"][
            "content"
        ]
        assert [e["token"] for e in strings] == [f"token_id:{i}" for i in ids]
    with ScriptedPolicyServer(flavor="sglang") as s:
        b = chat(s, msgs, return_token_ids=True, return_output_ids=True).json()
        choice = b["choices"][0]
        assert "prompt_token_ids" not in b and isinstance(choice["prompt_token_ids"], list)
        assert choice["token_ids"] == b["sglext"]["output_ids"] == ids
        assert "reasoning_content" in choice["message"]
    with ScriptedPolicyServer(flavor="vllm-old") as s:
        b = chat(s, msgs, return_token_ids=True).json()
        assert (
            "token_ids" not in b["choices"][0] and "prompt_token_ids" not in b
        )  # silently ignored
        assert "reasoning_content" in b["choices"][0]["message"]
        err = chat(s, msgs, model="nope")
        assert err.status_code == 404 and err.json()["object"] == "error"  # flat envelope
    with ScriptedPolicyServer(flavor="openai") as s:
        err = chat(s, msgs, return_token_ids=True)
        assert err.status_code == 400
        assert (
            err.json()["error"]["message"]
            == "Unrecognized request argument supplied: return_token_ids"
        )
        b = chat(s, msgs).json()
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # always reported
        assert "reasoning" not in b["choices"][0]["message"]


def test_prefix_cache_accounting(vllm):
    a, b, c = probe_images(3)
    first = chat(vllm, [user("Look at these", [a, b])]).json()["usage"]
    assert first["prompt_tokens_details"] is None  # 0 cached: omitted, as vLLM does
    second = chat(vllm, [user("Look at these", [a, b])]).json()["usage"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"] and cached % 16 == 0
    assert second["prompt_tokens"] - cached <= 16  # everything but the last block
    # the shared prefix ends at the first image that differs
    third = chat(vllm, [user("Look at these", [a, c])]).json()["usage"]
    cached3 = third["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached3 < cached
    assert third["prompt_tokens"] - cached3 >= vllm.image_tokens - 16
    assert [r.cached_tokens for r in vllm.chat_requests] == [0, cached, cached3]


def test_faults_errors_image_limit_and_truncation():
    shots = probe_images(3)
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(error_every=2, image_limit=2)) as s:
        statuses = [chat(s, [user(f"task {i}")]).status_code for i in range(4)]
        assert statuses == [200, 500, 200, 500]
        err = chat(s, [user("many", shots)])
        assert err.status_code == 400
        assert err.json()["error"]["message"] == (
            "At most 2 image(s) may be provided in one prompt. Set `--limit-mm-per-prompt` to increase this limit."
        )
        s.faults.error_every = 0
        short = chat(s, [user("task 0")], max_tokens=3).json()["choices"][0]
        assert short["finish_reason"] == "length" and len(short["logprobs"]["content"]) == 3
    with ScriptedPolicyServer(flavor="vllm-old", faults=Faults(image_limit=1)) as s:
        err = chat(s, [user("many", shots)])
        assert err.json()["message"] == "At most 1 image(s) may be provided in one request."


def test_trickle_hang_sends_bytes_then_answers():
    faults = Faults(hang_every=1, hang_mode="trickle", hang_seconds=0.4, trickle_interval=0.05)
    with ScriptedPolicyServer(flavor="vllm", faults=faults) as s:
        t0 = time.monotonic()
        resp = chat(s, [user("slow")])
        assert time.monotonic() - t0 >= 0.35
        assert resp.content.startswith(b"     ") and resp.json()["choices"][0]["message"]["content"]
        assert s.chat_requests[0].fault == "hang"


def test_request_log_and_auth_never_keep_the_key():
    key = "sk-scripted-LOG-CHECK-424242"
    with ScriptedPolicyServer(flavor="vllm", api_key=key, record_bodies=True) as s:
        ok = httpx.post(
            s.url + "/v1/chat/completions",
            json={"model": s.model, "messages": [user("hi")]},
            headers={"Authorization": f"Bearer {key}"},
        )
        bad = httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert (
        ok.status_code == 200 and bad.status_code == 401 and bad.json() == {"error": "Unauthorized"}
    )
    assert [(r.path, r.authorized, r.bearer) for r in s.requests] == [
        ("/v1/chat/completions", True, True),
        ("/v1/models", False, True),
    ]
    assert key not in repr(list(s.requests))


def test_cli_runs_in_foreground_until_sigterm(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"default": ["only answer"]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", "scripted-policy", "--port", "0", "--flavor", "sglang",
         "--script", str(script), "--model", "cli-model"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env=os.environ | {"LEGATO_POLICY_KEY": ""},
    )  # fmt: skip
    try:
        line = proc.stderr.readline()
        assert "NOT a model" in line, line
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        body = {"model": "cli-model", "messages": [user("x")]}
        resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=10).json()
        assert resp["choices"][0]["message"]["content"] == "only answer"
        assert "reasoning_content" in resp["choices"][0]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal (exit status of SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert "Traceback" not in proc.stderr.read()
