"""PolicyClient against real scripted servers on 127.0.0.1, one per wire flavor: normalization,
token-id fallbacks, deadlines and re-tries, fail-fast configuration errors, secrets, and the
byte-exact image splice."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest
from pydantic import ValidationError

from legato_pipelines.errors import ImageLimitError, PolicyConfigError, PolicyError, PolicyTimeout
from legato_pipelines.policy import PolicyClient, PolicyConfig
from legato_pipelines.policy.probe import probe_images
from legato_pipelines.policy.scripted import Faults, Latency, ScriptedPolicyServer
from legato_pipelines.policy.wire import encode_body, error_text, image_limit, normalize

SECRET = "sk-legato-TEST-SECRET-0123456789"


def config(server: ScriptedPolicyServer, **kw) -> PolicyConfig:
    return PolicyConfig(base_url=server.url, model=kw.pop("model", server.model), **kw)


def prompt(text: str = "Open the File menu and save the document", shots=()) -> tuple[list, dict]:
    parts = [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": s.ref}} for s in shots
    ]
    return [
        {"role": "system", "content": "You are a computer-use agent."},
        {"role": "user", "content": parts},
    ], {s.sha: s for s in shots}


@pytest.fixture
def no_key(monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)


# -- normalization per flavor ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flavor", "source", "reasoning_field"),
    [
        ("vllm", "choice.token_ids", "reasoning"),
        ("sglang", "choice.token_ids", "reasoning_content"),
    ],
)
async def test_ids_logprobs_and_cached_tokens(no_key, flavor, source, reasoning_field):
    shots = probe_images(2)
    with ScriptedPolicyServer(flavor=flavor) as server:
        async with PolicyClient(config(server)) as client:
            first = await client.complete(*prompt(shots=shots))
            second = await client.complete(*prompt(shots=shots))
    assert first.token_ids_source == source and first.reasoning_field == reasoning_field
    assert len(first.token_ids) == len(first.logprobs) == first.completion_tokens > 0
    assert first.tokens is None  # strings only when there are no ids
    assert first.prompt_token_ids and len(first.prompt_token_ids) == first.prompt_tokens
    assert first.notes == [] and first.attempts == 1 and first.timeouts == 0
    assert first.content.startswith("Action: ") and first.finish_reason == "stop"
    assert first.cached_tokens is None  # omitted when 0: unknown, not 0
    assert 0 < second.cached_tokens < second.prompt_tokens
    record = first.model_record()
    assert record["cached_tokens"] is None and record["token_ids_source"] == source


async def test_old_vllm_silent_ignore_is_detected_then_token_id_strings(no_key):
    with ScriptedPolicyServer(flavor="vllm-old") as server:
        async with PolicyClient(config(server)) as client:
            first = await client.complete(*prompt())
            second = await client.complete(*prompt())
    assert first.token_ids is None and "token_ids_ignored" in first.notes  # not an empty list
    assert first.tokens and "".join(first.tokens) == first.content
    assert client.token_ids_ignored and not client.token_ids_dropped
    assert second.token_ids_source == "logprobs.token_id_strings" and second.tokens is None
    assert len(second.token_ids) == len(second.logprobs) == second.completion_tokens
    sent = [set(r.fields) for r in server.chat_requests]
    assert "return_tokens_as_token_ids" not in sent[0] and "return_tokens_as_token_ids" in sent[1]


async def test_openai_400_on_return_token_ids_drops_it_for_the_batch(no_key):
    with ScriptedPolicyServer(flavor="openai") as server:
        async with PolicyClient(config(server)) as client:
            results = [await client.complete(*prompt(f"task {i}")) for i in range(3)]
    assert client.token_ids_dropped
    sent = [r.fields for r in server.chat_requests]
    assert [r.status for r in server.chat_requests] == [400, 200, 200, 200]
    assert "return_token_ids" in sent[0] and all("return_token_ids" not in f for f in sent[1:])
    assert all("logprobs" in f for f in sent)  # logprobs kept
    for r in results:
        assert r.notes[0] == "token_ids_dropped"
        assert r.token_ids is None and r.logprobs and "".join(r.tokens) == r.content
        assert r.cached_tokens is not None  # hosted OpenAI always reports it
        assert r.reasoning_field is None
    assert results[0].attempts == 2  # the refused request and the same call without the field


async def test_unknown_field_rejection_on_vllm_and_length_mismatch(no_key):
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(completion_tokens_offset=1)) as server:
        async with PolicyClient(config(server)) as client:
            r = await client.complete(*prompt())
    assert r.token_ids is not None
    n = len(r.token_ids)
    assert f"length_mismatch: token_ids={n} logprobs={n} completion_tokens={n + 1}" in r.notes
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(reject_unknown_fields=True)) as server:
        async with PolicyClient(config(server)) as client:
            r = await client.complete(*prompt())
        assert client.token_ids_dropped and r.logprobs and "token_ids_dropped" in r.notes


async def test_null_token_ids_bug_is_noticed_and_recovered(no_key):
    # vLLM #28246: prompt ids came back, token_ids null
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(token_ids_null=True)) as server:
        async with PolicyClient(config(server)) as client:
            first = await client.complete(*prompt())
            second = await client.complete(*prompt())
    assert first.token_ids is None and "token_ids_ignored" in first.notes and first.prompt_token_ids
    assert second.token_ids_source == "logprobs.token_id_strings"


async def test_server_without_logprobs_says_so(no_key):
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(no_logprobs=True)) as server:
        async with PolicyClient(config(server)) as client:
            r = await client.complete(*prompt())
    assert r.logprobs is None and "logprobs_missing" in r.notes


def test_normalize_sglext_and_envelopes():
    payload = {
        "choices": [{"message": {"content": "ab", "reasoning_content": "r"}, "finish_reason": "stop",
                     "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.0}]}}],
        "sglext": {"output_ids": [[7, 8]], "input_ids": [[1, 2, 3]]},
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": None},
    }  # fmt: skip
    r = normalize(payload, asked_ids=True)
    assert (r.token_ids, r.token_ids_source, r.prompt_token_ids) == (
        [7, 8],
        "sglext.output_ids",
        [1, 2, 3],
    )
    assert r.reasoning == "r" and r.cached_tokens is None and r.notes == []
    assert (
        error_text(
            b'{"error":{"message":"nested","type":"BadRequestError","param":null,"code":400}}'
        )
        == "nested"
    )
    assert (
        error_text(
            b'{"object":"error","message":"flat","type":"BadRequestError","param":null,"code":400}'
        )
        == "flat"
    )
    assert error_text(b'{"error":"Unauthorized"}') == "Unauthorized"
    assert error_text(b"Internal Server Error") == "Internal Server Error"
    assert image_limit("At most 1 image(s) may be provided in one request.") == 1
    assert image_limit("At most 20 image(s) may be provided in one prompt. Set ...") == 20
    assert image_limit("too many images") is None


def test_extra_body_checked():
    with pytest.raises(ValidationError, match="did you mean 'return_tokens_as_token_ids'"):
        PolicyConfig(
            base_url="http://127.0.0.1:1", model="m", extra_body={"return_tokens_as_token_id": True}
        )
    with pytest.raises(ValidationError, match="PolicyConfig.temperature"):
        PolicyConfig(base_url="http://127.0.0.1:1", model="m", extra_body={"temperature": 0.5})
    PolicyConfig(
        base_url="http://127.0.0.1:1",
        model="m",
        extra_body={"chat_template_kwargs": {}, "top_k": 20},
    )


async def test_extra_body_reaches_the_server(no_key):
    with ScriptedPolicyServer(flavor="vllm", record_bodies=True) as server:
        cfg = config(
            server, extra_body={"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
        )
        async with PolicyClient(cfg) as client:
            await client.complete(*prompt())
    body = orjson.loads(server.chat_requests[0].body)
    assert body["top_k"] == 20 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert (
        body["logprobs"] is True and body["top_logprobs"] == 0 and body["return_token_ids"] is True
    )


# -- the request body -------------------------------------------------------------------------


async def test_spliced_body_is_byte_exact(no_key):
    shots = probe_images(3)
    trap = 'a literal "url":"legato-image://' + shots[0].sha + '" inside text stays text'
    messages, images = prompt(trap, shots)
    messages.append({"role": "assistant", "content": "Action: look\n<tool_call>\n{}\n</tool_call>"})
    messages.append(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": shots[1].ref}}]}
    )
    with ScriptedPolicyServer(flavor="vllm", record_bodies=True) as server:
        async with PolicyClient(config(server)) as client:
            await client.complete(messages, images)
    raw = server.chat_requests[0].body
    for shot in shots:
        assert b'"url":"' + shot.data_url + b'"' in raw
    assert raw.count(b'"url":"data:image/png;base64,') == 4
    received = orjson.loads(raw)["messages"]
    expected = orjson.loads(orjson.dumps(messages))
    for msg in expected:
        for part in msg["content"] if isinstance(msg["content"], list) else []:
            if part["type"] == "image_url":
                part["image_url"]["url"] = images[
                    part["image_url"]["url"].rsplit("/", 1)[1]
                ].data_url.decode()
    assert received == expected and received[1]["content"][0]["text"] == trap
    with pytest.raises(ValueError, match=shots[2].sha):
        encode_body({"messages": prompt(shots=shots)[0]}, {s.sha: s for s in shots[:2]})


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sleep", "trickle"])
async def test_hang_every_7th_every_call_finishes_within_the_bound(no_key, mode):
    step_timeout, retries, backoff = 0.5, 1, 0.05
    faults = Faults(hang_every=7, hang_mode=mode, hang_seconds=30, trickle_interval=0.05)
    with ScriptedPolicyServer(flavor="vllm", faults=faults) as server:
        cfg = config(server, step_timeout=step_timeout, retries=retries, backoff=backoff)
        async with PolicyClient(cfg, max_inflight=8) as client:

            async def timed(i: int):
                t0 = time.monotonic()
                try:
                    result = await client.complete(*prompt(f"task {i}"))
                except PolicyError as exc:
                    result = exc
                return result, time.monotonic() - t0

            outcomes = await asyncio.wait_for(
                asyncio.gather(*(timed(i) for i in range(30))), timeout=30
            )
    bound = (
        step_timeout * (retries + 1) + backoff * 2**retries + 0.5
    )  # + scheduling slack (2 shared cores)
    responses = [r for r, _ in outcomes if not isinstance(r, Exception)]
    assert all(isinstance(r, PolicyTimeout) for r, _ in outcomes if isinstance(r, Exception))
    assert all(wall <= bound for _, wall in outcomes), max(w for _, w in outcomes)
    assert all(r.seconds <= bound for r in responses)
    hung = [r for r in responses if r.timeouts]
    assert hung and all(
        r.attempts == 2 and r.timeouts == 1 and r.seconds >= step_timeout for r in hung
    )
    assert (
        sum(1 for r in server.chat_requests if r.fault == "hang") == len(server.chat_requests) // 7
    )


async def test_5xx_and_429_are_retried_then_fail_with_server_words(no_key):
    with ScriptedPolicyServer(
        flavor="vllm", faults=Faults(error_every=2, error_status=429)
    ) as server:
        async with PolicyClient(config(server, retries=1, backoff=0.01)) as client:
            results = [await client.complete(*prompt(f"task {i}")) for i in range(4)]
    assert [r.attempts for r in results] == [1, 2, 2, 2]  # requests 2, 4, 6 answer 429
    with ScriptedPolicyServer(flavor="sglang", faults=Faults(error_every=1)) as server:
        async with PolicyClient(config(server, retries=2, backoff=0.01)) as client:
            with pytest.raises(PolicyError) as info:
                await client.complete(*prompt())
    assert not isinstance(info.value, PolicyConfigError)
    assert info.value.attempts == 3 and info.value.status_code == 500
    assert "scripted fault: injected HTTP 500" in str(info.value)
    assert len(server.chat_requests) == 3


async def test_connection_refused(no_key):
    with ScriptedPolicyServer() as server:
        url = server.url
    cfg = PolicyConfig(base_url=url, model="m", retries=1, backoff=0.01)
    async with PolicyClient(cfg) as client:
        with pytest.raises(PolicyConfigError, match=rf"{url}/v1/models: Connection refused"):
            await client.check()
        with pytest.raises(PolicyError, match="ConnectError") as info:
            await client.complete(*prompt())
    assert info.value.attempts == 2


async def test_404_fails_fast_listing_models(no_key):
    with ScriptedPolicyServer(flavor="vllm") as server:
        async with PolicyClient(config(server, model="qwen-typo", retries=3)) as client:
            with pytest.raises(PolicyConfigError) as info:
                await client.check()
            assert "'qwen-typo' is not served" in str(info.value) and "scripted-qwen" in str(
                info.value
            )
            with pytest.raises(PolicyConfigError) as info:
                await client.complete(*prompt())
    message = str(info.value)
    assert "The model `qwen-typo` does not exist." in message  # the server's own words
    assert "the server offers: scripted-qwen" in message
    assert info.value.attempts == 1 and len(server.chat_requests) == 1


@pytest.mark.parametrize("flavor", ["vllm", "vllm-old"])
async def test_image_limit_reported_with_the_fix(no_key, flavor):
    with ScriptedPolicyServer(flavor=flavor, faults=Faults(image_limit=2)) as server:
        async with PolicyClient(config(server, retries=2)) as client:
            with pytest.raises(ImageLimitError) as info:
                await client.complete(*prompt(shots=probe_images(3)))
    assert info.value.limit == 2 and info.value.attempts == 1
    assert "At most 2 image(s)" in str(info.value)
    assert "--image-max" in str(info.value) and "--limit-mm-per-prompt" in str(info.value)


async def test_max_inflight_bounds_requests_and_queueing_is_not_call_time(no_key):
    with ScriptedPolicyServer(flavor="vllm", latency=Latency(0.1)) as server:
        async with PolicyClient(config(server), max_inflight=10) as client:  # pool shards of 8 + 2
            t0 = time.monotonic()
            results = await asyncio.gather(*(client.complete(*prompt(f"t{i}")) for i in range(50)))
            wall = time.monotonic() - t0
    assert server.peak_inflight == 10
    assert wall >= 0.49  # 50 calls of 0.1 s, ten at a time: the last ten wait >= 0.4 s for a slot
    seconds = sorted(r.seconds for r in results)
    assert 0.09 <= seconds[0] and seconds[-1] < 0.35, seconds  # waiting for a slot is not call time


# -- secrets ----------------------------------------------------------------------------------


async def test_key_goes_only_to_the_server_as_bearer(monkeypatch, caplog, capsys):
    monkeypatch.setenv("LEGATO_POLICY_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    errors: list[BaseException] = []
    faults = Faults(error_every=3, image_limit=2)
    with ScriptedPolicyServer(flavor="vllm", api_key=SECRET, faults=faults) as server:
        async with PolicyClient(config(server, retries=1, backoff=0.01)) as client:
            assert await client.check() == ["scripted-qwen"]
            for i in range(5):
                await client.complete(*prompt(f"task {i}"))
            for bad in (prompt(shots=probe_images(3)),):
                try:
                    await client.complete(*bad)
                except PolicyError as exc:
                    errors.append(exc)
        async with PolicyClient(config(server, model="nope")) as client:
            try:
                await client.complete(*prompt())
            except PolicyError as exc:
                errors.append(exc)
        assert server.requests and all(r.authorized for r in server.requests)
    # a server that quotes the key it was given (an OpenAI-like 401 for a wrong key)
    with ScriptedPolicyServer(flavor="openai", api_key="sk-the-right-one") as server:
        async with PolicyClient(config(server)) as client:
            for call in (client.check(), client.complete(*prompt())):
                try:
                    await call
                except PolicyConfigError as exc:
                    errors.append(exc)
        assert [r.authorized for r in server.requests] == [False, False]
    assert len(errors) == 4
    assert "Incorrect API key provided: [redacted]" in str(errors[-1])
    out = capsys.readouterr()
    texts = [str(e) for e in errors] + [repr(e) for e in errors] + [caplog.text, out.out, out.err]
    texts += [repr(server.requests)]
    assert not any(SECRET in t for t in texts)
    assert SECRET not in repr(config(server))


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:8001/?key={SECRET}",
        f"http://127.0.0.1:8001/v1?api_key={SECRET}&x=1",
        f"http://127.0.0.1:8001/v1#{SECRET}",
        f"http://user:{SECRET}@127.0.0.1:8001",
    ],
)
def test_a_policy_url_with_a_query_fragment_or_credentials_is_refused_unechoed(url):
    """Request paths are appended to the URL (``.../?key=.../v1/models``) and a query string is
    where keys hide: refused at configuration, the error never quoting the URL."""
    with pytest.raises(ValidationError) as info:
        PolicyConfig(base_url=url, model="m")
    message = str(info.value)
    assert "LEGATO_POLICY_KEY" in message and "base_url" in message
    assert SECRET[:9] not in message and SECRET[:9] not in repr(info.value)  # not even cut
    assert PolicyConfig(base_url="http://127.0.0.1:8001/v1/", model="m").api_base.endswith(
        ":8001/v1"
    )


async def test_calls_leave_no_cyclic_garbage(no_key):
    """A model call frees everything it made by reference counting: httpx's Response and its
    stream refer to each other, a cycle per call that only the cyclic GC frees (and that made
    it run, scanning the heap, ever more often at 1,000 rollouts in flight)."""
    import gc

    messages, images = prompt(shots=probe_images(1))
    with ScriptedPolicyServer() as server:
        async with PolicyClient(config(server), max_inflight=4) as client:
            await client.complete(messages, images)  # connections and caches warmed up
            gc.collect()
            gc.disable()
            try:
                for _ in range(20):
                    await client.complete(messages, images)
                unreachable = gc.collect()
            finally:
                gc.enable()
    assert unreachable < 20, f"{unreachable} objects in reference cycles after 20 calls"
