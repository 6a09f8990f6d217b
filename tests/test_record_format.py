"""The run record format (``legato_pipelines.record``) against a run directory written before
the typed format existed (``tests/data/run_v0``: 3 fake tasks, group 2, oversample 0.5, with
``ok``, ``cancelled``, ``retried`` and ``error`` records): every line round-trips byte for
byte, the old directory still exports and profiles, and a collection resumes into it."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from legato_pipelines import (
    DesktopConfig,
    PolicyConfig,
    collect,
    export_steps,
    group_advantages,
    profile,
    read_records,
)
from legato_pipelines import record as fmt
from legato_pipelines.record import ActionRecord, ErrorInfo, Record, Step
from legato_pipelines.store.rundir import RECORDS, read_typed_records
from tests.lake_synthetic import write_run_dir

OLD_RUN = Path(__file__).parent / "data" / "run_v0"
OLD_TASKS = Path(__file__).parent / "data" / "run_v0_tasks.json"


def test_the_format_module_is_the_bottom_layer():
    source = Path(fmt.__file__).read_text()
    assert "from ." not in source and "import legato_pipelines" not in source
    from legato_pipelines.rollout import statuses
    from legato_pipelines.store import lake_tables

    assert statuses.FINAL_FOR_TRAINING is fmt.FINAL_FOR_TRAINING == {"ok", "truncated"}
    assert lake_tables.STATUSES is fmt.STATUSES and lake_tables.PHASES is fmt.PHASES


@pytest.mark.parametrize("source", ["old_engine", "synthetic"])
def test_old_lines_round_trip_byte_for_byte(source, tmp_path):
    if source == "old_engine":
        path = OLD_RUN / RECORDS
    else:
        write_run_dir(tmp_path / "run")
        path = tmp_path / "run" / RECORDS
    lines = path.read_bytes().splitlines()
    assert lines
    for line in lines:
        record = Record.from_json_dict(orjson.loads(line))
        assert orjson.dumps(record.to_json_dict()) == line
    statuses = {r.status for r in read_typed_records(path.parent)}
    if source == "old_engine":
        assert {"ok", "cancelled", "retried", "error"} <= statuses


def test_typed_accessors_read_the_old_records():
    records = read_typed_records(OLD_RUN)
    raw = read_records(OLD_RUN)
    for typed, plain in zip(records, raw, strict=True):
        assert typed.rollout_id == plain["rollout_id"] and typed.status == plain["status"]
        assert typed.final == (plain["status"] in ("ok", "truncated"))
        assert typed.timing.total_s == plain["timing"]["total_s"]
        assert typed.env_failure == bool(plain["error"] and plain["error"]["kind"] == "env")
        for step, plain_step in zip(typed.steps, plain["steps"], strict=True):
            assert step.response.logprobs == plain_step["response"]["logprobs"]
            assert step.model.seconds == plain_step["model"]["seconds"]
            assert [a.ready_s for a in step.actions] == [
                a["ready_s"] for a in plain_step["actions"]
            ]
    assert group_advantages(records) == group_advantages(raw)


def test_unknown_keys_survive_and_optional_keys_stay_out():
    # a newer writer's key in an action, in a step and in the record survives; written after
    # the known keys
    line = (OLD_RUN / RECORDS).read_bytes().splitlines()[0]
    data = orjson.loads(line)
    data["steps"][0]["actions"][0]["future_flag"] = False
    data["steps"][0]["new_field"] = [1]
    data["later"] = {"x": 1}
    record = Record.from_json_dict(data)
    assert record.steps[0].actions[0].extra("future_flag") is False
    assert record.steps[0].extra("new_field") == [1]
    assert orjson.dumps(record.to_json_dict()) == orjson.dumps(data)
    moved = {"future_flag": True, **data["steps"][0]["actions"][0]}
    assert ActionRecord.from_json_dict(moved).to_json_dict() == moved  # same keys and values

    # built by the engine: keys the format writes only when they apply stay out until set
    error = ErrorInfo(kind=fmt.ENV, type="crash", message="m", phase="act")
    assert "attempts" not in error.to_json_dict()
    error.attempts = 2
    assert error.to_json_dict()["attempts"] == 2
    done = ActionRecord(action="left_click", arguments={"coordinate": [1, 2]}, screen=[1, 2])
    done.act_s, done.wait_s, done.ready_s = 0.1, 0.2, None
    done.timed_out = True  # an unknown key set by a newer writer is written, last
    assert list(done.to_json_dict()) == [
        "action",
        "arguments",
        "screen",
        "act_s",
        "wait_s",
        "ready_s",
        "timed_out",
    ]
    assert list(Step(step=0).to_json_dict()) == [
        "step",
        "request",
        "response",
        "model",
        "action_text",
        "parse_error",
        "actions",
        "obs_s",
        "observation",
    ]
    # ints stay ints, floats stay floats (0 must not become 0.0)
    assert orjson.dumps(fmt.Timing.from_json_dict({"queue_s": 0, "act_s": 1.0}).to_json_dict()) == (
        b'{"queue_s":0,"act_s":1.0}'
    )


def test_old_run_directory_exports_and_profiles(tmp_path):
    table = export_steps(OLD_RUN)
    final = [r for r in read_records(OLD_RUN) if r["status"] in ("ok", "truncated")]
    assert table.num_rows == sum(r["n_steps"] for r in final) > 0
    assert set(table.column("status").to_pylist()) == {"ok"}
    assert all(table.column("response_logprobs").to_pylist())
    summary = profile(OLD_RUN)
    old = orjson.loads((OLD_RUN / "summary.json").read_bytes())
    for key in ("counts", "scheduled", "retries", "records", "missing", "groups", "steps"):
        assert summary[key] == old[key], key
    assert summary["success_rate"] == pytest.approx(old["success_rate"])
    assert summary["time_share"] == pytest.approx(old["time_share"])


def _keys(value, drop=frozenset()):
    """The key layout of a JSON value, in order (lists: of their first element), without the
    keys in ``drop``."""
    if isinstance(value, dict):
        return [(k, _keys(v, drop)) for k, v in value.items() if k not in drop]
    if isinstance(value, list) and value and isinstance(value[0], dict | list):
        return [_keys(value[0], drop)]
    return None


def test_old_run_directory_resumes(policy_server, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    lines = (run / RECORDS).read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if orjson.loads(line)["task_id"] != "fake-002"]
    (run / RECORDS).write_bytes(b"".join(kept))
    policy = PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="step-3")
    summary = collect(
        str(OLD_TASKS),
        policy,
        run,
        desktops=2,
        desktop=DesktopConfig(backend="fake"),
        group=2,
        oversample=0.5,
        max_steps=3,
    )
    data = (run / RECORDS).read_bytes()
    assert data.startswith(b"".join(kept))  # the old lines stay as they were
    records = read_records(run)
    assert len(records) > len(kept)
    assert {r["task_id"] for r in records[len(kept) :]} == {"fake-002"}  # only what was missing
    assert summary["missing"] == 0 and summary["groups"]["closed"] == 3
    for line in data.splitlines():
        assert orjson.dumps(Record.from_json_dict(orjson.loads(line)).to_json_dict()) == line
    # the typed writer lays records out as the old one did (same keys, same order)
    old_ok = next(orjson.loads(line) for line in kept if b'"status":"ok"' in line)
    new_ok = next(r for r in records[len(kept) :] if r["status"] == "ok")
    # (plus what the format gained since: whether each ready wait timed out, and the prompt
    # ids and system_fingerprint the server returned, optional keys written only when it
    # sends them; the reset on the critical path, written when the engine measured it)
    drop = {"timed_out", "prompt_ids", "system_fingerprint", "reset_critical_s", "reset_ahead"}
    assert _keys(new_ok, drop=drop) == _keys(old_ok)
