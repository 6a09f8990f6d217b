"""Numbers a trainer can trust (issue 13): each case goes through a real loopback scripted
server speaking the wire format, the engine, the run directory and the Parquet samples."""

from __future__ import annotations

import json
import math
import random

import orjson
import pyarrow.parquet as pq
import pytest

from legato_pipelines import PolicyConfig, group_advantages, profile, read_records
from legato_pipelines.desktops.backends.fake import FakeDesktop
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.errors import ResumeError
from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer
from legato_pipelines.record import decode_prompt_ids, encode_prompt_ids
from legato_pipelines.rollout.engine import collect
from legato_pipelines.rollout.scheduler import attempt_seed
from legato_pipelines.store.export import export_steps, write_table
from legato_pipelines.tasks import Evaluation, load_tasks
from tests.engine_support import fake_tasks

CLICK = (
    "Action: Click the button.\n<tool_call>\n"
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 500]}}'
    "\n</tool_call>"
)
CLICKS = {"default": [CLICK]}  # every step clicks: attempts run to max_steps


def _policy(server, **kw) -> PolicyConfig:
    return PolicyConfig(
        base_url=server.url, model=server.model, version="step-1", backoff=0.0, **kw
    )


def _samples(run_dir, tmp_path) -> list[dict]:
    """The samples as a trainer reads them: through a Parquet file."""
    path = write_table(export_steps(run_dir), tmp_path / "samples.parquet")
    return pq.read_table(path).to_pylist()


def _fake() -> DesktopConfig:
    return DesktopConfig(backend="fake")


# -- exact prompt ids ----------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_prompt_token_ids_exported_equal_what_the_server_sent(flavor, tmp_path):
    with ScriptedPolicyServer(flavor=flavor, script=CLICKS) as server:
        run = tmp_path / "run"
        collect(
            load_tasks(fake_tasks(2)),
            _policy(server),
            run,
            desktops=1,
            desktop=_fake(),
            group=2,
            max_steps=5,
        )
        sent = list(server.prompt_ids_sent)
    rows = _samples(run, tmp_path)
    assert len(rows) == len(sent) == 2 * 2 * 5
    assert [r["prompt_token_ids"] for r in rows] == sent  # one desktop: the order of the calls
    # stored per step as a delta on the previous step's prompt, not the whole prompt again
    record = read_records(run)[0]
    steps = record["steps"]
    assert steps[0]["prompt_ids"]["prefix"] == 0
    assert all(s["prompt_ids"]["prefix"] > 0 for s in steps[1:])
    assert sum(len(orjson.dumps(s["prompt_ids"])) for s in steps) < len(orjson.dumps(sent[4]))


def test_prompt_ids_codec_round_trips_runs_and_prefixes():
    a = [1, 2, 3] + [7] * 100 + [4]
    b = a + [5] + [9] * 30 + [6]
    c = [1, 2] + [8] * 3
    enc_a = encode_prompt_ids(None, a)
    assert enc_a == {"prefix": 0, "tail": [1, 2, 3, [7, 100], 4]}
    enc_b = encode_prompt_ids(a, b)
    assert enc_b == {"prefix": len(a), "tail": [5, [9, 30], 6]}
    assert decode_prompt_ids(None, enc_a) == a
    assert decode_prompt_ids(a, enc_b) == b
    assert decode_prompt_ids(b, encode_prompt_ids(b, c)) == c
    assert decode_prompt_ids(None, encode_prompt_ids(None, [])) == []
    rng = random.Random(1)
    for _ in range(500):  # any pair of prompts: the prefix is the longest common one
        prev = [rng.randrange(3) for _ in range(rng.randrange(12))]
        ids = prev[: rng.randrange(len(prev) + 1)] + [
            rng.randrange(3) for _ in range(rng.randrange(12))
        ]
        enc = encode_prompt_ids(prev, ids)
        common = next(
            (i for i, (x, y) in enumerate(zip(prev, ids, strict=False)) if x != y),
            min(len(prev), len(ids)),
        )
        assert enc["prefix"] == common and decode_prompt_ids(prev, enc) == ids


def test_no_prompt_ids_column_values_when_the_server_sends_none(tmp_path):
    with ScriptedPolicyServer(flavor="openai", script=CLICKS) as server:
        collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run", desktops=1,
                desktop=_fake(), group=1, max_steps=2)  # fmt: skip
    rows = _samples(tmp_path / "run", tmp_path)
    assert rows and all(r["prompt_token_ids"] is None for r in rows)
    assert all("prompt_ids" not in s for s in read_records(tmp_path / "run")[0]["steps"])


# -- flagged logprobs ----------------------------------------------------------------------


def test_sentinel_logprob_is_flagged_and_never_a_number(tmp_path):
    with ScriptedPolicyServer(script=CLICKS, faults=Faults(sentinel_every=2)) as server:
        summary = collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run",
                          desktops=1, desktop=_fake(), group=1, max_steps=4)  # fmt: skip
    rows = _samples(tmp_path / "run", tmp_path)
    flagged = [r for r in rows if r["logprob_sentinels"]]
    assert [r["step"] for r in flagged] == [1, 3]
    for r in flagged:
        assert r["response_logprobs"][0] is None  # not -9999.0, not NaN: no value at all
        assert r["logprob_sentinels"] == 1 and r["logprobs_valid"] is False
        assert all(v is None or v > -9999 for v in r["response_logprobs"])
    assert all(r["logprobs_valid"] for r in rows if not r["logprob_sentinels"])
    assert summary["quality"]["logprob_sentinel_steps"] == 2
    step = read_records(tmp_path / "run")[0]["steps"][1]
    assert step["response"]["logprobs"][0] is None
    assert "logprob_sentinels: 1" in step["model"]["notes"]


def test_old_records_with_minus_9999_are_flagged_on_export(tmp_path):
    with ScriptedPolicyServer(script=CLICKS) as server:
        collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run", desktops=1,
                desktop=_fake(), group=1, max_steps=2)  # fmt: skip
    path = tmp_path / "run" / "rollouts.jsonl"
    record = orjson.loads(path.read_bytes())
    record["steps"][0]["response"]["logprobs"][2] = -9999.0  # as a writer before the fix kept it
    path.write_bytes(orjson.dumps(record) + b"\n")
    rows = _samples(tmp_path / "run", tmp_path)
    assert rows[0]["response_logprobs"][2] is None and rows[0]["logprob_sentinels"] == 1


def test_length_mismatch_is_a_column_counted_by_check_and_profile(tmp_path):
    from legato_pipelines.assets import checks

    faults = Faults(mismatch_every=1, extra_logprobs=11)
    with ScriptedPolicyServer(script=CLICKS, faults=faults) as server:
        summary = collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run",
                          desktops=1, desktop=_fake(), group=2, max_steps=3)  # fmt: skip
    rows = _samples(tmp_path / "run", tmp_path)
    assert len(rows) == 6
    for r in rows:
        assert len(r["response_logprobs"]) == len(r["response_token_ids"]) + 11
        assert r["length_mismatch"] is True and r["logprobs_valid"] is False
    assert summary["quality"]["length_mismatches"] == 6
    assert summary["quality"]["logprobs_valid_share"] == 0.0
    result = checks.logprobs_coverage(pq.read_table(tmp_path / "samples.parquet"), 0.95)
    assert result.passed is False
    assert result.metadata["length_mismatches"].value == 6


# -- rewards never invented ----------------------------------------------------------------


class _Graded(FakeDesktop):
    """A fake desktop whose evaluator answers ``rewards[attempt]`` (NaN for a broken one)."""

    rewards = (1.0, math.nan, math.nan, math.nan)

    async def reset(self, task, *, seed=0):
        self._attempt = next(a for a in range(8) if attempt_seed(0, task.task_id, a) == seed)
        return await super().reset(task, seed=seed)

    async def evaluate(self, task, *, last_action_fail=False):
        return Evaluation(self.rewards[self._attempt])


def test_nan_reward_is_an_evaluator_error_never_a_sample(tmp_path):
    pool = [_Graded(_fake(), i) for i in range(2)]
    with ScriptedPolicyServer(script=CLICKS) as server:
        summary = collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run",
                          desktop_pool=pool, group=4, max_steps=2)  # fmt: skip
    records = read_records(tmp_path / "run")
    broken = [r for r in records if r["attempt"] != 0]
    assert {r["status"] for r in broken} == {"retried", "error"}
    assert all(r["reward"] is None for r in broken)
    assert all(r["error"]["type"] == "invalid_reward" for r in broken)
    assert all("nan" in r["error"]["message"] for r in broken)
    raw = (tmp_path / "run" / "rollouts.jsonl").read_text()
    assert "NaN" not in raw
    rows = _samples(tmp_path / "run", tmp_path)
    assert {r["attempt"] for r in rows} == {0}  # only the validly graded attempt trains
    assert all(r["reward"] == 1.0 and r["reward_valid"] for r in rows)
    # 1 graded attempt of a group of 4: marked incomplete, no advantage from part of a group
    assert all(r["advantage"] is None and r["group_complete"] is False for r in rows)
    assert {(r["group_size"], r["group_size_expected"]) for r in rows} == {(1, 4)}
    assert summary["success_rate"] == 1.0 and summary["graded"] == 1
    assert summary["quality"]["invalid_rewards"] == 6  # 3 attempts x (1 + env_retries 1)
    assert profile(tmp_path / "run")["success_rate"] == 1.0


def test_group_advantages_is_total_over_invalid_rewards():
    def rec(i, reward, status="ok"):
        return {"rollout_id": f"r{i}", "group_id": "g", "reward": reward, "status": status}

    out = group_advantages([rec(0, 1.0), rec(1, math.nan), rec(2, None), rec(3, math.inf)])
    assert out == {"r0": 0.0, "r1": None, "r2": None, "r3": None}
    out = group_advantages([rec(0, 1.0), rec(1, 0.0), rec(2, math.nan), rec(3, 0.0)])
    assert out["r2"] is None
    assert math.isclose(out["r0"], 2**0.5) and math.isclose(out["r1"], -(2**0.5) / 2)
    assert group_advantages([rec(0, None), rec(1, math.nan)]) == {"r0": None, "r1": None}
    assert group_advantages([]) == {}


# -- server-side aborts and truncation -----------------------------------------------------


@pytest.mark.parametrize("fault", ["abort_every", "empty_every"])
def test_aborted_or_empty_200_is_retried_then_a_policy_error(fault, tmp_path):
    with ScriptedPolicyServer(script=CLICKS, faults=Faults(**{fault: 1})) as server:
        summary = collect(load_tasks(fake_tasks(1)), _policy(server, retries=1), tmp_path / "run",
                          desktops=1, desktop=_fake(), group=2, max_steps=3)  # fmt: skip
        assert server.request_count == 4  # 2 attempts x (1 + 1 re-try)
    records = read_records(tmp_path / "run")
    assert [r["status"] for r in records] == ["error", "error"]
    assert all(r["error"]["kind"] == "policy" and r["error"]["attempts"] == 2 for r in records)
    assert all(not r["steps"] for r in records)  # never a step, never a parse error
    assert export_steps(tmp_path / "run").num_rows == 0
    assert summary["parse_errors"] == 0 and summary["quality"]["server_aborts"] == 2


def test_abort_then_good_answer_is_one_clean_step(tmp_path):
    with ScriptedPolicyServer(script=CLICKS, faults=Faults(abort_every=2)) as server:
        summary = collect(load_tasks(fake_tasks(1)), _policy(server, retries=2), tmp_path / "run",
                          desktops=1, desktop=_fake(), group=1, max_steps=3)  # fmt: skip
    rows = _samples(tmp_path / "run", tmp_path)
    assert len(rows) == 3 and all(r["finish_reason"] == "stop" for r in rows)
    assert all(r["parse_error"] is None for r in rows)
    assert summary["quality"]["server_aborts"] >= 1 and summary["parse_errors"] == 0


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_context_length_400_truncates_that_attempt_and_the_batch_goes_on(flavor, tmp_path):
    with ScriptedPolicyServer(flavor=flavor, script=CLICKS) as probe:
        collect(load_tasks(fake_tasks(1)), _policy(probe, max_tokens=64), tmp_path / "probe",
                desktops=1, desktop=_fake(), group=1, max_steps=4)  # fmt: skip
    prompt = [s["model"]["prompt_tokens"] for s in read_records(tmp_path / "probe")[0]["steps"]]
    limit = prompt[3] + 64 - 1  # step 3's prompt no longer fits with max_tokens 64
    faults = Faults(max_model_len=limit)
    with ScriptedPolicyServer(flavor=flavor, script=CLICKS, faults=faults) as server:
        summary = collect(load_tasks(fake_tasks(3)), _policy(server, max_tokens=64),
                          tmp_path / "run", desktops=2, desktop=_fake(), group=2,
                          max_steps=6, image_max=20)  # fmt: skip
    records = read_records(tmp_path / "run")
    assert len(records) == 6  # every task ran
    for r in records:
        assert r["status"] == "truncated" and r["outcome"] == "context_length"
        assert r["n_steps"] == 3 and r["reward"] in (0.0, 1.0)  # graded
        assert "maximum context length" in r["truncation"]
        assert "--image-max" in r["truncation"] and "--max-tokens" in r["truncation"]
    assert summary["quality"]["context_length_truncations"] == 6
    assert "--image-max (now 20)" in summary["quality"]["advice"]
    assert "--max-tokens (now 64)" in summary["quality"]["advice"]
    assert len(_samples(tmp_path / "run", tmp_path)) == 18
    from typer.testing import CliRunner

    from legato_pipelines.cli import app

    shown = CliRunner().invoke(app, ["profile", str(tmp_path / "run")], terminal_width=400)
    assert shown.exit_code == 0, shown.output
    assert "context-length truncations" in shown.output and "--image-max" in shown.output


def test_other_config_errors_still_fail_the_batch(tmp_path):
    from legato_pipelines.errors import ImageLimitError

    with ScriptedPolicyServer(script=CLICKS, faults=Faults(image_limit=1)) as server:
        with pytest.raises(ImageLimitError):
            collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run", desktops=1,
                    desktop=_fake(), group=1, max_steps=3)  # fmt: skip


# -- sampling settings on record -----------------------------------------------------------


def test_sampling_settings_are_the_runs_identity(tmp_path):
    run = tmp_path / "run"
    with ScriptedPolicyServer(script=CLICKS, record_bodies=True) as server:
        policy = _policy(server, temperature=0.6, top_p=0.9, max_tokens=512, sampling_seed=7)
        summary = collect(load_tasks(fake_tasks(1)), policy, run, desktops=1, desktop=_fake(),
                          group=1, max_steps=2)  # fmt: skip
        body = orjson.loads(server.chat_requests[0].body)
        # each request its own seed, derived from the run's (issue 31)
        first_seed = policy.request_seed("fake-000", "fake-000", 0, 0)
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (
            0.6, 0.9, 512, first_seed,
        )  # fmt: skip
        sampling = {"temperature": 0.6, "top_p": 0.9, "max_tokens": 512, "seed": 7,
                    "seeds": "per_step", "logprobs_mode": None}  # fmt: skip
        assert json.loads((run / "run.json").read_text())["sampling"] == sampling
        assert summary["sampling"] == sampling
        rows = _samples(run, tmp_path)
        assert {(r["temperature"], r["top_p"], r["max_tokens"]) for r in rows} == {(0.6, 0.9, 512)}
        assert [r["sampling_seed"] for r in rows] == [
            policy.request_seed("fake-000", "fake-000", 0, step) for step in range(len(rows))
        ]  # the seed each step's request carried
        with pytest.raises(ResumeError, match="temperature 0.6.*--temperature"):
            collect(load_tasks(fake_tasks(1)), _policy(server, top_p=0.9, max_tokens=512,
                    sampling_seed=7), run, desktops=1, desktop=_fake(), group=1, max_steps=2)  # fmt: skip
        with pytest.raises(ResumeError, match="--sampling-seed"):
            collect(load_tasks(fake_tasks(1)), _policy(server, temperature=0.6, top_p=0.9,
                    max_tokens=512), run, desktops=1, desktop=_fake(), group=1, max_steps=2)  # fmt: skip
        collect(load_tasks(fake_tasks(1)), policy, run, desktops=1, desktop=_fake(), group=1,
                max_steps=2)  # the same settings resume  # fmt: skip


def test_logprobs_mode_as_the_server_reports_it(tmp_path):
    with ScriptedPolicyServer(script=CLICKS, logprobs_mode="processed_logprobs") as server:
        collect(load_tasks(fake_tasks(1)), _policy(server), tmp_path / "run", desktops=1,
                desktop=_fake(), group=1, max_steps=1)  # fmt: skip
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["sampling"]["logprobs_mode"] == "processed_logprobs"
    assert {r["logprobs_mode"] for r in _samples(tmp_path / "run", tmp_path)} == {
        "processed_logprobs"
    }


def test_collect_cli_has_sampling_flags(tmp_path):
    from typer.testing import CliRunner

    from legato_pipelines.cli import app

    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(1)))
    with ScriptedPolicyServer(script=CLICKS, record_bodies=True) as server:
        args = ["collect", "--tasks", str(tasks), "--policy-url", server.url, "--model",
                server.model, "--backend", "fake", "--group", "1", "--max-steps", "1",
                "--desktops", "1", "--no-progress", "--temperature", "0.6", "--top-p", "0.9",
                "--max-tokens", "300", "--sampling-seed", "3", "--out", str(tmp_path / "run")]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        body = orjson.loads(server.chat_requests[0].body)
    seed = PolicyConfig(base_url=server.url, model="m", sampling_seed=3).request_seed(
        "fake-000", "fake-000", 0, 0
    )
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (
        0.6, 0.9, 300, seed,
    )  # fmt: skip
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["sampling"]["temperature"] == 0.6 and meta["sampling"]["seed"] == 3
