"""The engine end to end: fake desktops, a real scripted policy server (vLLM wire format) on
loopback, real run directories. Statuses, accounting, advantages, dedup, resume."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from legato_pipelines import (
    DesktopConfig,
    PolicyConfig,
    PolicyConfigError,
    ResumeError,
    collect,
    export_steps,
    group_advantages,
    load_request,
    load_tasks,
    profile,
    read_records,
)
from legato_pipelines.record import superseded
from legato_pipelines.store.rundir import message_sha
from tests.engine_support import fake_tasks


def policy(server, **kw) -> PolicyConfig:
    return PolicyConfig(
        base_url=server.url, model=server.model, version=kw.pop("version", "step-1"), **kw
    )


def fake(**options) -> DesktopConfig:
    return DesktopConfig(backend="fake", options=options)


def assert_accounted(records, summary):
    """Every scheduled attempt ends in exactly one settling record per logical attempt (the
    others: ``retried``, or an ``error`` a resume re-ran)."""
    assert summary["missing"] == 0
    assert len(records) == summary["scheduled"] + summary["retries"]
    finals = Counter(
        (r["task_id"], r["attempt"])
        for r, gone in zip(records, superseded(records), strict=True)
        if not gone
    )
    assert set(finals.values()) == {1}
    assert len(finals) == summary["scheduled"]


def test_ok_batch_records_contract(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(3, success=0.5))
    summary = collect(
        tasks, policy(policy_server), tmp_path, desktops=3, desktop=fake(), group=4, max_steps=8
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["counts"]["ok"] == 12 and summary["groups"] == {"total": 3, "closed": 3}
    for r in records:
        assert r["policy"] == {"model": policy_server.model, "version": "step-1"}
        assert r["task_set"] == tasks.task_set
        assert r["status"] == "ok" and r["reward"] in (0.0, 1.0)
        assert r["outcome"] in ("done", "fail", "max_steps")
        assert 1 <= r["n_steps"] == len(r["steps"]) <= 8
        for s in r["steps"]:
            assert s["response"]["token_ids"] and len(s["response"]["token_ids"]) == len(
                s["response"]["logprobs"]
            )
            assert s["model"]["completion_tokens"] == len(s["response"]["token_ids"])
            assert all(isinstance(h, str) and len(h) == 64 for h in s["request"])
            for a in s["actions"]:
                assert {"act_s", "wait_s", "ready_s"} <= set(a)
    assert summary["logprobs_share"] == 1.0 and summary["token_ids_share"] == 1.0
    assert (tmp_path / "summary.json").exists()


def test_rewards_are_seeded_and_deterministic(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(4, success=0.5))
    rewards = []
    for run in ("a", "b"):
        collect(
            tasks,
            policy(policy_server),
            tmp_path / run,
            desktops=2,
            desktop=fake(),
            group=3,
            max_steps=3,
            seed=7,
        )
        rewards.append(
            sorted((r["task_id"], r["attempt"], r["reward"]) for r in read_records(tmp_path / run))
        )
    assert rewards[0] == rewards[1]
    assert {r for _, _, r in rewards[0]} == {0.0, 1.0}


def test_skipped_when_group_full_before_start(policy_server, tmp_path):
    # group 1 + 2 oversampled attempts on one desktop: the first ok closes the group.
    summary = collect(
        load_tasks(fake_tasks(2)),
        policy(policy_server),
        tmp_path,
        desktops=1,
        desktop=fake(),
        group=1,
        oversample=2.0,
        max_steps=3,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["counts"]["ok"] == 2 and summary["counts"]["skipped"] == 4
    for r in records:
        if r["status"] == "skipped":
            assert r["steps"] == [] and r["desktop"] is None


def test_cancelled_and_surplus(policy_server, tmp_path):
    # group 1 of 4 attempts on 4 desktops with varying act latency: the fastest closes the group;
    # the others are cancelled at their next step, or surplus if already grading.
    summary = collect(
        load_tasks(fake_tasks(1)),
        policy(policy_server),
        tmp_path / "c",
        desktops=4,
        desktop=fake(latency={"act": {"dist": "uniform", "low": 0.01, "high": 0.3}}, seed=3),
        group=1,
        oversample=3.0,
        max_steps=15,
    )
    records = read_records(tmp_path / "c")
    assert_accounted(records, summary)
    assert summary["counts"]["ok"] == 1 and summary["counts"]["cancelled"] >= 1
    for r in records:
        if r["status"] == "cancelled":
            assert r["reward"] is None
    # Everyone grading at once (slow evaluator, identical scripts): the first graded closes the group.
    summary = collect(
        load_tasks(fake_tasks(1)),
        policy(policy_server),
        tmp_path / "s",
        desktops=2,
        desktop=fake(latency={"evaluate": {"dist": "uniform", "low": 0.1, "high": 0.4}}, seed=1),
        group=1,
        oversample=1.0,
        max_steps=15,
    )
    records = read_records(tmp_path / "s")
    assert_accounted(records, summary)
    assert Counter(r["status"] for r in records) == {"ok": 1, "surplus": 1}
    surplus = next(r for r in records if r["status"] == "surplus")
    assert surplus["reward"] is not None  # graded, just late


def test_truncated_by_rollout_timeout(policy_server, tmp_path):
    summary = collect(
        load_tasks(fake_tasks(2)),
        policy(policy_server),
        tmp_path,
        desktops=2,
        desktop=fake(latency={"act": 0.15}),
        group=2,
        max_steps=15,
        rollout_timeout=0.3,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    truncated = [r for r in records if r["status"] == "truncated"]
    assert truncated and all(
        r["outcome"] == "timeout" and r["reward"] is not None for r in truncated
    )
    assert all(r["timing"]["total_s"] < 0.3 + 0.15 * 3 + 1.0 for r in truncated)


def test_retried_and_env_error(policy_server, tmp_path):
    # every reset fails: each attempt is retried env_retries times, then ends as an env error
    summary = collect(
        load_tasks(fake_tasks(2)),
        policy(policy_server),
        tmp_path,
        desktops=2,
        desktop=fake(faults={"reset_failure": 1.0}),
        group=2,
        env_retries=2,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["counts"]["retried"] == 8 and summary["counts"]["error"] == 4
    assert summary["env_errors"] == 4 and summary["env_failures"] == 12
    for r in records:
        assert r["error"]["kind"] == "env" and r["error"]["type"] == "reset"
    executions = Counter((r["task_id"], r["attempt"]) for r in records)
    assert set(executions.values()) == {3}
    ids = [r["rollout_id"] for r in records]
    assert len(set(ids)) == len(ids)  # a retry keeps the logical identity, gets a new rollout_id


def test_policy_error_kind(tmp_path):
    from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

    with ScriptedPolicyServer(flavor="vllm", faults=Faults(error_every=1)) as server:
        # the server answers 500 to every completion: after retries, an error record of kind policy
        summary = collect(
            load_tasks(fake_tasks(1)),
            PolicyConfig(base_url=server.url, model=server.model, retries=1, backoff=0.01),
            tmp_path,
            desktops=1,
            desktop=fake(),
            group=2,
        )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["counts"]["error"] == 2 and summary["policy_errors"] == 2
    assert all(r["error"]["kind"] == "policy" for r in records)


@pytest.mark.parametrize(
    "fault",
    [
        "reset_failure",
        "act_failure",
        "crash",
        "hung_evaluator",
        "truncated_screenshot",
        "observe_error",
    ],
)
def test_faults_at_ten_percent_nothing_unaccounted(policy_server, tmp_path, fault):
    desktop = DesktopConfig(
        backend="fake", eval_timeout=0.2, options={"faults": {fault: 0.1}, "seed": 5}
    )
    summary = collect(
        load_tasks(fake_tasks(6)),
        policy(policy_server),
        tmp_path,
        desktops=4,
        desktop=desktop,
        group=4,
        max_steps=6,
        env_retries=3,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["retries"] > 0
    kinds = {r["error"]["type"] for r in records if r["status"] == "retried"}
    assert kinds == {
        {
            "reset_failure": "reset",
            "act_failure": "act",
            "crash": "crash",
            "hung_evaluator": "evaluator",
            "truncated_screenshot": "unexpected",  # Pillow cannot decode half a PNG
            "observe_error": "unexpected",  # a plain OSError, not a DesktopError
        }[fault]
    }


def test_unexpected_exceptions_end_the_attempt_not_the_batch(policy_server, tmp_path):
    """The attempt is the boundary: half a PNG (Pillow's error) and a plain OSError are env
    failures of that attempt, retried per env_retries, never a batch abort; the record names
    the exception's type and where it was raised."""
    desktop = fake(faults={"truncated_screenshot": 1.0})
    summary = collect(
        load_tasks(fake_tasks(2)),
        policy(policy_server),
        tmp_path,
        desktops=2,
        desktop=desktop,
        group=2,
        env_retries=1,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["counts"]["retried"] == 4 and summary["counts"]["error"] == 4
    assert summary["env_failure_kinds"] == {"unexpected": 8}  # the profile's env facts per kind
    for r in records:
        assert r["error"]["kind"] == "env" and r["error"]["type"] == "unexpected"
        assert r["error"]["phase"] == "observe"
        # Pillow's own words, and the line that raised them
        assert "Error" in r["error"]["message"] and "(at " in r["error"]["message"]


def test_a_desktop_whose_recover_raises_retires_without_aborting(policy_server, tmp_path):
    """A backend bug in recover() (a plain exception) retires that desktop; the other desktop
    finishes the batch and nothing is lost."""
    from legato_pipelines.desktops.backends.fake import FakeDesktop

    class BrokenRecover(FakeDesktop):
        async def recover(self) -> None:
            raise RuntimeError("recover() bug")

    broken = BrokenRecover(DesktopConfig(backend="fake", options={"faults": {"crash": 1.0}}), 0)
    healthy = FakeDesktop(DesktopConfig(backend="fake"), 1)
    summary = collect(
        load_tasks(fake_tasks(3)),
        policy(policy_server),
        tmp_path,
        desktop_pool=[broken, healthy],
        group=2,
        env_retries=2,
        max_steps=3,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["counts"]["ok"] == 6  # every logical attempt finished on the healthy desktop


def test_advantages_hand_computed():
    def rec(rid, group, reward, status="ok"):
        return {"rollout_id": rid, "group_id": group, "reward": reward, "status": status}

    records = [
        rec("a", "g", 1.0),
        rec("b", "g", 0.0),
        rec("c", "g", 0.0),
        rec("d", "g", 1.0),
        rec("x", "g", 1.0, "cancelled"),
        rec("e", "h", 0.5),
        rec("f", "h", 0.5),
        rec("t", "k", 1.0, "truncated"),
        rec("u", "k", 0.0),
    ]
    adv = group_advantages(records)
    # group g: rewards 1,0,0,1 -> mean .5, population std .5 -> +1, -1, -1, +1; cancelled excluded
    assert adv["a"] == pytest.approx(1.0) and adv["b"] == pytest.approx(-1.0) and "x" not in adv
    assert adv["e"] == adv["f"] == 0.0  # all equal -> 0
    assert adv["t"] == pytest.approx(1.0) and adv["u"] == pytest.approx(-1.0)  # truncated counts


def test_export_advantages_match_records(policy_server, tmp_path):
    collect(
        load_tasks(fake_tasks(3, success=0.5)),
        policy(policy_server),
        tmp_path,
        desktops=3,
        desktop=fake(),
        group=4,
        max_steps=4,
        seed=11,
    )
    records = [r for r in read_records(tmp_path) if r["status"] == "ok"]
    table = export_steps(tmp_path)
    assert table.num_rows == sum(r["n_steps"] for r in records)
    rows = table.to_pylist()
    by_group: dict[str, list[float]] = {}
    for r in records:
        by_group.setdefault(r["group_id"], []).append(r["reward"])
    for row in rows:
        rewards = np.array(by_group[row["group_id"]])
        expect = 0.0 if rewards.std() == 0 else (row["reward"] - rewards.mean()) / rewards.std()
        assert row["advantage"] == pytest.approx(expect)
        assert (
            row["policy_version"] == "step-1"
            and row["response_token_ids"]
            and row["response_logprobs"]
        )
        assert orjson.loads(row["messages"])[0]["role"] == "system"
    for group in by_group:
        advs = {row["rollout_id"]: row["advantage"] for row in rows if row["group_id"] == group}
        assert math.isclose(sum(advs.values()), 0.0, abs_tol=1e-9)


def test_images_and_messages_stored_once(policy_server, tmp_path):
    collect(
        load_tasks(fake_tasks(2)),
        policy(policy_server),
        tmp_path,
        desktops=2,
        desktop=fake(),
        group=2,
        max_steps=10,
    )
    records = read_records(tmp_path)
    shas = {s["observation"] for r in records for s in r["steps"]}
    assert {p.stem for p in (tmp_path / "images").glob("*.png")} == shas
    referenced = {h for r in records for s in r["steps"] for h in s["request"]}
    stored = {p.stem for p in (tmp_path / "messages").glob("*.json")}
    assert referenced == stored
    total_refs = sum(len(s["request"]) for r in records for s in r["steps"])
    assert len(stored) < total_refs  # a message sent at several steps is stored once
    for p in (tmp_path / "messages").glob("*.json"):
        assert message_sha(orjson.loads(p.read_bytes()))[0] == p.stem
        assert b"base64" not in p.read_bytes()  # images by ref only


def test_load_request_is_what_the_server_received(tmp_path):
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    with ScriptedPolicyServer(flavor="vllm", record_bodies=True) as server:
        collect(
            load_tasks(fake_tasks(1)),
            policy(server),
            tmp_path,
            desktops=1,
            desktop=fake(),
            group=1,
            max_steps=4,
        )
    record = read_records(tmp_path)[0]
    sent = [orjson.loads(r.body)["messages"] for r in server.chat_requests]
    for step in range(record["n_steps"]):
        messages = load_request(tmp_path, record["rollout_id"], step)
        assert messages == sent[step]
        if step:
            prev = load_request(tmp_path, record["rollout_id"], step - 1)
            assert messages[: len(prev)] == prev  # append-only prompt
    with pytest.raises(KeyError):
        load_request(tmp_path, record["rollout_id"], record["n_steps"])


def test_wrong_model_fails_fast_before_desktops(policy_server, tmp_path):
    with pytest.raises(PolicyConfigError) as info:
        collect(
            load_tasks(fake_tasks(1)),
            PolicyConfig(base_url=policy_server.url, model="no-such-model"),
            tmp_path,
            desktops=1,
            desktop=fake(),
        )
    assert policy_server.model in str(info.value)
    assert read_records(tmp_path) == []


def test_resume_refuses_other_version_or_task_set(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(1))
    collect(
        tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=1, max_steps=2
    )
    with pytest.raises(ResumeError, match="policy version"):
        collect(
            tasks,
            policy(policy_server, version="step-2"),
            tmp_path,
            desktops=1,
            desktop=fake(),
            group=1,
        )
    with pytest.raises(ResumeError, match="task set"):
        collect(
            load_tasks(fake_tasks(2)),
            policy(policy_server),
            tmp_path,
            desktops=1,
            desktop=fake(),
            group=1,
        )


def test_resume_drops_torn_line_and_reruns_missing(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(3))
    collect(
        tasks, policy(policy_server), tmp_path, desktops=2, desktop=fake(), group=2, max_steps=3
    )
    path = Path(tmp_path) / "rollouts.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    # lose the last two records (in flight at a crash) and tear the one before
    path.write_bytes(b"".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    assert len(read_records(tmp_path)) == len(lines) - 3
    summary = collect(
        tasks, policy(policy_server), tmp_path, desktops=2, desktop=fake(), group=2, max_steps=3
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["groups"]["closed"] == 3
    assert profile(tmp_path)["counts"] == summary["counts"]


def test_resume_reruns_attempts_a_policy_outage_ended_in_error(policy_server, tmp_path):
    """The policy server fails every call from the 3rd record on: those attempts end as
    ``error`` kind ``policy``, their groups stay open and the summary says so; re-running the
    same collection re-runs exactly them as new executions (the error records stay, counted
    as re-tries) and closes every group."""
    from legato_pipelines.assets.checks import no_attempt_unaccounted
    from legato_pipelines.store.lake_tables import Lineage, rollouts_table

    tasks = load_tasks(fake_tasks(4))
    seen = 0

    def outage(_line):
        nonlocal seen
        seen += 1
        if seen == 3:
            policy_server.faults.error_every = 1  # the server answers 500 from now on

    knobs = dict(desktops=2, desktop=fake(), group=2, max_steps=3)
    pol = policy(policy_server, retries=0, backoff=0.01)
    first = collect(tasks, pol, tmp_path, on_record=outage, **knobs)
    before = read_records(tmp_path)
    errored = {(r["task_id"], r["attempt"]) for r in before if r["status"] == "error"}
    assert errored and all(r["error"]["kind"] == "policy" for r in before if r["status"] == "error")
    open_groups = first["groups"]["total"] - first["groups"]["closed"]
    assert open_groups > 0
    assert first["incomplete"] == {"groups": open_groups, "errors": {"policy": len(errored)}}

    policy_server.faults.error_every = 0  # the server is back
    summary = collect(tasks, pol, tmp_path, **knobs)
    records = read_records(tmp_path)
    assert records[: len(before)] == before  # nothing already collected is rewritten
    rerun = records[len(before) :]
    assert {(r["task_id"], r["attempt"]) for r in rerun} == errored
    assert all(r["execution"] == 1 and r["status"] == "ok" for r in rerun)
    assert summary["groups"] == {"total": 4, "closed": 4}
    assert summary["incomplete"] == {"groups": 0, "errors": {}}
    assert summary["retries"] == len(errored) and summary["counts"]["error"] == len(errored)
    assert_accounted(records, summary)
    assert profile(tmp_path)["retries"] == summary["retries"]
    table = rollouts_table(records, Lineage("step-1", tasks.task_set, "r"))
    check = no_attempt_unaccounted(table, summary["scheduled"])
    assert check.passed, check.metadata

    # a third run finds nothing to do
    again = collect(tasks, pol, tmp_path, **knobs)
    assert len(read_records(tmp_path)) == len(records) and again["incomplete"]["groups"] == 0


def test_one_collection_at_a_time_per_run_directory(policy_server, tmp_path):
    import asyncio

    from legato_pipelines import collect_async

    tasks = load_tasks(fake_tasks(2))

    async def both():
        slow = fake(latency={"act": 0.05})
        first = asyncio.create_task(
            collect_async(
                tasks,
                policy(policy_server),
                tmp_path,
                desktops=2,
                desktop=slow,
                group=2,
                max_steps=4,
            )
        )
        while not (tmp_path / "rollouts.jsonl").exists():
            await asyncio.sleep(0.01)
        with pytest.raises(ResumeError, match="in use by another collection"):
            await collect_async(
                tasks,
                policy(policy_server),
                tmp_path,
                desktops=2,
                desktop=fake(),
                group=2,
                max_steps=4,
            )
        return await first

    summary = asyncio.run(both())
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert Counter(r["status"] for r in records) == {"ok": 4}


def test_failed_start_writes_nothing_and_model_must_match_on_resume(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(1))
    with pytest.raises(PolicyConfigError):
        collect(
            tasks,
            PolicyConfig(base_url=policy_server.url, model="wrong", version="v9"),
            tmp_path,
            desktop=fake(),
        )
    assert not (tmp_path / "run.json").exists()
    collect(
        tasks,
        policy(policy_server, version="v1"),
        tmp_path,
        desktops=1,
        desktop=fake(),
        group=1,
        max_steps=2,
    )
    other = PolicyConfig(base_url=policy_server.url, model="another-model", version="v1")
    with pytest.raises(ResumeError, match="model"):
        collect(tasks, other, tmp_path, desktops=1, desktop=fake(), group=1)


def test_resumed_batch_reports_throughput_over_all_sessions(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(2))
    first = collect(
        tasks,
        policy(policy_server),
        tmp_path,
        desktops=2,
        desktop=fake(latency={"reset": 0.1}),
        group=2,
        max_steps=2,
    )
    again = collect(
        tasks, policy(policy_server), tmp_path, desktops=2, desktop=fake(), group=2, max_steps=2
    )
    assert again["wall_s"] >= first["wall_s"] > 0
    assert again["rollouts_per_hour"] <= first["rollouts_per_hour"] * (1 + 1e-6)


def test_corrupt_line_in_the_middle_is_an_error_not_a_silent_drop(policy_server, tmp_path):
    from legato_pipelines import ConfigError

    tasks = load_tasks(fake_tasks(2))
    collect(
        tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=2, max_steps=2
    )
    path = tmp_path / "rollouts.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"{garbage\n" + b"".join(lines[1:]))
    with pytest.raises(ConfigError, match="line 2 of 5"):
        read_records(tmp_path)
    with pytest.raises(ConfigError, match="line 2"):
        collect(
            tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=2, max_steps=2
        )
    assert len(path.read_bytes().splitlines()) == 5  # nothing truncated


def test_tasks_unrunnable_on_the_backend_are_refused_before_any_desktop(policy_server, tmp_path):
    from legato_pipelines import TaskListError

    bad = fake_tasks(2)
    bad[1]["config"]["evaluator"] = {
        "func": "exact_matc",
        "result": {"type": "vm_command_line", "command": "true"},
        "expected": {"type": "rule", "rules": {"expected": ""}},
    }
    with pytest.raises(TaskListError, match=r"tasks\[1\].*exact_matc.*did you mean exact_match"):
        collect(
            load_tasks(bad),
            policy(policy_server),
            tmp_path,
            desktops=1,
            desktop=DesktopConfig(backend="local"),
        )
    assert not tmp_path.joinpath("run.json").exists() and policy_server.request_count == 0


def test_resume_refuses_other_collection_settings(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(1))
    collect(
        tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=1, max_steps=2
    )
    with pytest.raises(ResumeError, match="max_steps"):
        collect(
            tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=1, max_steps=5
        )
    with pytest.raises(ResumeError, match="image_max"):
        collect(
            tasks,
            policy(policy_server),
            tmp_path,
            desktops=1,
            desktop=fake(),
            group=1,
            max_steps=2,
            image_max=4,
        )


def test_resume_refuses_another_seed(policy_server, tmp_path):
    """The seed fixes every attempt's seed (the fake backend's rewards): a resume with another
    one would mix two seedings in one run, so it is refused like the other settings."""
    tasks = load_tasks(fake_tasks(2))
    knobs = dict(desktops=1, desktop=fake(), group=1, max_steps=2)
    collect(tasks, policy(policy_server), tmp_path, seed=3, **knobs)
    assert orjson.loads((tmp_path / "run.json").read_bytes())["knobs"]["seed"] == 3
    before = read_records(tmp_path)
    with pytest.raises(ResumeError, match=r"seed 3, not 4.*\(fix: --seed 3, or another --out\)"):
        collect(tasks, policy(policy_server), tmp_path, seed=4, **knobs)
    assert read_records(tmp_path) == before
    collect(tasks, policy(policy_server), tmp_path, seed=3, **knobs)  # the same seed resumes


def test_out_a_non_empty_directory_that_is_no_run_is_refused_and_left_alone(
    policy_server, tmp_path
):
    """A user's folder with a summary.json of their own is not a run directory: refused before
    anything starts, naming --out and the fix, every file as it was; an empty folder, or one a
    collection left before writing run.json (its lock, empty messages/ and images/), is fine."""
    tasks = load_tasks(fake_tasks(1))
    knobs = dict(desktops=1, desktop=fake(), group=1, max_steps=2)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"mine": 1}')
    with pytest.raises(ResumeError, match=r"not empty \(summary.json\).*fix: --out a new"):
        collect(tasks, policy(policy_server), mine, **knobs)
    assert [p.name for p in mine.iterdir()] == ["summary.json"]
    assert (mine / "summary.json").read_text() == '{"mine": 1}'
    assert policy_server.request_count == 0

    left = tmp_path / "left"
    for name in ("messages", "images"):
        (left / name).mkdir(parents=True)
    (left / ".lock").write_text("123")
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (left, empty):
        summary = collect(tasks, policy(policy_server), out, **knobs)
        assert summary["groups"]["closed"] == 1


def test_a_line_that_is_not_a_record_is_an_error(policy_server, tmp_path):
    from legato_pipelines import ConfigError

    collect(
        load_tasks(fake_tasks(1)),
        policy(policy_server),
        tmp_path,
        desktops=1,
        desktop=fake(),
        group=2,
        max_steps=2,
    )
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b'{"rollout_id": "x", "step": 0}\n' + path.read_bytes())
    with pytest.raises(ConfigError, match="line 1 is not a rollout record"):
        read_records(tmp_path)


@pytest.mark.parametrize("screen", [(1280, 720), (1920, 1080)])
def test_collector_does_no_pixel_work_when_the_desktop_resizes(
    policy_server, tmp_path, monkeypatch, screen
):
    """Desktops that resize (observe(size=)) hand out the model-size PNG: the collector never
    decodes, resizes or encodes a screenshot (both are made to fail here), and what it stores
    and sends is what the collector-side path makes of the full screen, pixel for pixel."""
    from PIL import Image

    from legato_pipelines.desktops.backends.fake import frame_pool
    from legato_pipelines.harness import Harness
    from legato_pipelines.harness import episode as episode_module
    from legato_pipelines.images import Screenshot

    def no_pixel_work(*args, **kwargs):
        raise AssertionError("the collector did pixel work on a screenshot")

    monkeypatch.setattr(episode_module, "resize_screenshot", no_pixel_work)
    monkeypatch.setattr(Screenshot, "to_pil", no_pixel_work)
    desktop = DesktopConfig(
        backend="fake", screen_width=screen[0], screen_height=screen[1], options={"unique": True}
    )
    summary = collect(
        load_tasks(fake_tasks(2)), policy(policy_server), tmp_path, desktops=2,
        desktop=desktop, group=2, max_steps=3,
    )  # fmt: skip
    assert summary["counts"]["ok"] == summary["records"] == 4 and summary["steps"] == 12
    monkeypatch.undo()
    rule = Harness().resize_rule
    expected = set()
    for frame in frame_pool(*screen):
        with Image.open(io.BytesIO(frame.png)) as img:
            expected.add(img.resize(rule.size(*screen)).tobytes())
    stored = list((tmp_path / "images").glob("*.png"))
    assert len(stored) == 12  # a new screenshot every step, as on real screens
    for path in stored:
        with Image.open(path) as img:
            assert img.size == rule.size(*screen) and img.tobytes() in expected


def test_a_batch_collects_young_garbage_less_often_and_restores_the_thresholds(
    policy_server, tmp_path
):
    """While a batch runs the young generation's GC threshold is GC_YOUNG_THRESHOLD (a step
    leaves ~70 long-lived objects; the default 700 made the cycle collector a fifth of the
    collector's CPU at 1,000 desktops); the thresholds in force before are restored after."""
    import gc

    from legato_pipelines.rollout.engine import GC_YOUNG_THRESHOLD

    before = gc.get_threshold()
    seen = []
    collect(
        load_tasks(fake_tasks(1)), policy(policy_server), tmp_path, desktops=1,
        desktop=fake(), group=2, max_steps=2, on_record=lambda r: seen.append(gc.get_threshold()),
    )  # fmt: skip
    assert seen and all(t == (GC_YOUNG_THRESHOLD, *before[1:]) for t in seen)
    assert gc.get_threshold() == before


async def test_desktop_client_calls_leave_no_cyclic_garbage():
    """The desktop client (every observe, act and wait of a local desktop) frees what a call
    made by reference counting: no httpx Response <-> stream cycle per call."""
    import gc

    import httpx

    from legato_pipelines.desktops.backends.fake import frame_pool
    from legato_pipelines.desktops.client import DesktopClient

    png = frame_pool(640, 480, frames=1)[0].png
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=png))
    client = DesktopClient("http://desktop.test:5000", "token", transport=transport)
    try:
        await client.observe((640, 480))
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                await client.observe((640, 480))
            unreachable = gc.collect()
        finally:
            gc.enable()
    finally:
        await client.aclose()
    assert unreachable < 20, f"{unreachable} objects in reference cycles after 20 calls"


def test_a_desktop_whose_observe_takes_no_size_gets_the_collector_side_resize(
    policy_server, tmp_path
):
    """A subclass of a resizing backend that overrides observe() without ``size`` (a test
    double, a wrapper) is called as observe() and the engine resizes what it sends."""
    from legato_pipelines.desktops.backends.fake import FakeDesktop
    from legato_pipelines.images import png_size
    from legato_pipelines.rollout.attempt import observes_at_size

    class FullScreen(FakeDesktop):
        async def observe(self):
            return await super().observe()

    config = DesktopConfig(backend="fake", options={"unique": True})
    desktop = FullScreen(config, 0)
    assert not observes_at_size(desktop) and observes_at_size(FakeDesktop(config, 1))
    summary = collect(
        load_tasks(fake_tasks(1)), policy(policy_server), tmp_path, desktops=1, group=1,
        max_steps=2, desktop_pool=[desktop],
    )  # fmt: skip
    assert summary["counts"]["ok"] == 1
    assert {png_size(p.read_bytes()) for p in (tmp_path / "images").glob("*.png")} == {(1280, 704)}


def _qwen_call(args: dict) -> str:
    call = {"name": "computer_use", "arguments": args}
    return f"Action: {args['action']}.\n<tool_call>\n{orjson.dumps(call).decode()}\n</tool_call>"


def test_click_outside_the_model_image_is_a_parse_error_and_sends_no_input(tmp_path):
    # qwen25vl sees a 1280x720 screen as a 1288x728 image: x 1800 is off it. The fake desktop
    # counts every action it is sent; an off-image click must not reach it (no edge click).
    from legato_pipelines.desktops.backends.fake import FakeDesktop
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    class Counting(FakeDesktop):
        async def act(self, action):
            sent.append((action.action, action.x, action.y))
            await super().act(action)

    sent: list = []
    script = {
        "default": [
            _qwen_call({"action": "left_click", "coordinate": [1800, 100]}),
            _qwen_call({"action": "left_click", "coordinate": [640, 364]}),
            _qwen_call({"action": "terminate", "status": "success"}),
        ]
    }
    config = DesktopConfig(backend="fake", screen_width=1280, screen_height=720)
    pool = [Counting(config, 0)]
    with ScriptedPolicyServer(flavor="vllm", script=script) as server:
        summary = collect(
            load_tasks(fake_tasks(1)), policy(server), tmp_path, desktop_pool=pool,
            desktop=config, group=1, max_steps=5, harness="qwen25vl",
        )  # fmt: skip
    (record,) = read_records(tmp_path)
    first, second, last = record["steps"]
    assert first["actions"] == []
    assert "invalid action: left_click coordinate [1800, 100]" in first["parse_error"]
    assert "outside the model's image (x 0..1287, y 0..727)" in first["parse_error"]
    assert second["actions"][0]["screen"] == [636, 360] and second.get("parse_error") is None
    assert sent == [("left_click", 636, 360)]  # the valid click only
    assert summary["parse_errors"] == 1 and record["outcome"] == "done"


def test_profile_percentiles_are_numpys():
    """The profile's model-call percentiles (computed without numpy, which `legato collect`
    no longer imports) equal numpy.percentile's default (linear) on any data."""
    import random

    from legato_pipelines.rollout.profile import percentile

    rng = random.Random(7)
    for n in (1, 2, 3, 10, 99, 1000):
        values = sorted(rng.lognormvariate(0, 1) for _ in range(n))
        for q in (50, 95, 99):
            assert percentile(values, q) == float(np.percentile(values, q)), (n, q)


def test_a_run_directory_without_records_starts_anew_whatever_its_settings(policy_server, tmp_path):
    """A batch stopped before its first record (desktops that never started: the default
    ``osworld`` backend without Docker) left only ``run.json``; the next ``collect`` with
    other settings (another backend, version, group) starts there instead of refusing to
    "resume" nothing. Once records exist, other settings are refused as before."""
    tasks = load_tasks(fake_tasks(1))
    collect(
        tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=1, max_steps=2
    )
    (tmp_path / "rollouts.jsonl").write_bytes(b"")  # as if no attempt had ended
    meta = json.loads((tmp_path / "run.json").read_text())
    meta["knobs"]["backend"] = "osworld"
    (tmp_path / "run.json").write_text(json.dumps(meta))
    summary = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "wall_s": 1000.0}))
    collect(
        tasks,
        policy(policy_server, version="step-2"),
        tmp_path,
        desktops=1,
        desktop=fake(),
        group=2,
        max_steps=2,
    )
    meta = json.loads((tmp_path / "run.json").read_text())
    assert (meta["policy"]["version"], meta["knobs"]["group"]) == ("step-2", 2)
    assert meta["knobs"]["backend"] == "fake"
    # the session that collected nothing is not counted in the wall (rollouts per hour)
    assert json.loads((tmp_path / "summary.json").read_text())["wall_s"] < 100
    with pytest.raises(ResumeError, match="policy version"):
        collect(tasks, policy(policy_server), tmp_path, desktops=1, desktop=fake(), group=2)
