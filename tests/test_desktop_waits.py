"""Every wait is named, configurable and recorded: ``DesktopConfig.waits``, the ready caps the
backends pass on, ``timed_out`` in each action's record and the profile's count of them."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from legato_pipelines import DesktopConfig, PolicyConfig, collect, load_tasks, read_records
from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import Wait, Waits, WaitsByMode
from legato_pipelines.desktops.ready import ScreenshotReady
from legato_pipelines.record import ActionRecord, Step
from legato_pipelines.rollout.profile import ready_timeouts
from tests.engine_support import fake_tasks


def test_waits_defaults_and_validation():
    waits = DesktopConfig().waits
    assert waits == Waits()
    assert (waits.ready_after_action_s, waits.ready_after_reset_s) == (5.0, 10.0)
    assert waits.ready_before_eval_s == 5.0 and waits.execute_timeout_s == 120.0
    assert waits.ready_cap("reset") == 10.0 and waits.ready_cap("action") == 5.0
    assert waits.wait_action(Action("wait")) == 1.0
    assert waits.wait_action(Action("wait", seconds=2.5)) == 2.5
    with pytest.raises(ValidationError):
        Waits(ready_after_action_s=0)
    with pytest.raises(ValidationError):
        Waits(ready_after_actoin_s=3)


def test_waits_given_among_the_desktop_options_move_into_waits():
    """The CLI's --desktop-option, LEGATO_BACKEND_OPTIONS and the Dagster resource all end in
    ``options``: a Waits field named there is a wait, not a backend option."""
    config = DesktopConfig(
        backend="local",
        options={"ready_after_action_s": 8, "cache_dir": "/c"},
        waits={"ready_after_reset_s": 20},
    )
    assert config.options == {"cache_dir": "/c"}
    assert config.waits.ready_after_action_s == 8.0
    assert config.waits.ready_after_reset_s == 20.0
    again = DesktopConfig.model_validate(config.model_dump())
    assert again == config


def test_the_dagster_desktop_resource_sets_waits_through_its_options():
    from legato_pipelines.resources.desktops import DesktopPoolResource

    resource = DesktopPoolResource(backend="fake", options={"ready_after_reset_s": 3.0})
    config = resource.config()
    assert config.waits.ready_after_reset_s == 3.0 and config.options == {}


class _Stub(WaitsByMode):
    def __init__(self, config, timed_out):
        self.config = config
        self.caps = []
        self.timed_out = timed_out

    async def _ready(self, mode, cap_s):
        self.caps.append((mode, cap_s))
        return (cap_s if self.timed_out else 0.01), self.timed_out


def test_waits_by_mode_passes_the_caps_and_reports_timed_out():
    config = DesktopConfig(waits={"ready_after_action_s": 0.5, "ready_before_eval_s": 0.7})
    stub = _Stub(config, timed_out=True)

    async def run():
        return [
            await stub.wait_after_reset(),
            await stub.wait_after_action(Action("left_click", x=1, y=1)),
            await stub.wait_before_eval(),
            await stub.wait_after_action(Action("wait")),
        ]

    waits = asyncio.run(run())
    assert stub.caps == [("reset", 10.0), ("action", 0.5), ("eval", 0.7)]
    assert [w.timed_out for w in waits] == [True, True, True, False]
    assert waits[1].ready_s == 0.5
    fixed = _Stub(DesktopConfig(ready_signal=False, fixed_wait=0.0), timed_out=True)
    wait = asyncio.run(fixed.wait_after_action(Action("left_click", x=1, y=1)))
    assert wait.ready_s is None and wait.timed_out is None and fixed.caps == []


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_screenshot_ready_honours_the_cap():
    """A screen that never settles times out at the cap it was given, not the default."""
    frames = iter(range(10_000))

    async def fetch():
        return _png(next(frames) % 200)

    ready = ScreenshotReady(fetch)
    result = asyncio.run(ready.wait("action", timeout_s=0.3))
    assert result.timed_out and 0.3 <= result.ready_s < 2.0
    still = ScreenshotReady(lambda: _async(_png(7)))
    assert not asyncio.run(still.wait("action", timeout_s=0.3)).timed_out


async def _async(value):
    return value


def test_profile_counts_ready_timeouts():
    def step(*actions):
        return Step(step=0, actions=[ActionRecord(action="wait", **a) for a in actions])

    steps = [
        step({"timed_out": True}, {"timed_out": False}),
        step({"timed_out": None}, {}),
        step({"timed_out": False}),
    ]
    assert ready_timeouts(steps) == {"count": 1, "share": 1 / 3}
    assert ready_timeouts([step({"ready_s": None})]) == {"count": 0, "share": None}


def test_records_carry_timed_out_per_action_and_reset(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(1, success=1.0))
    policy = PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="s")
    summary = collect(
        tasks, policy, tmp_path, desktops=1, desktop=DesktopConfig(), group=1, max_steps=3
    )
    records = read_records(tmp_path)
    actions = [a for r in records for s in r["steps"] for a in s["actions"]]
    assert actions and all(a["timed_out"] is False for a in actions)
    assert all(r["reset"]["timed_out"] is False for r in records)
    assert summary["ready_timeouts"] == {"count": 0, "share": 0.0}
    assert Wait(1.0).timed_out is None


@pytest.mark.slow
def test_profile_lake_and_report_count_reset_timeouts(policy_server, tmp_path):
    """A reset whose ready wait hit its cap (``reset.timed_out``) is counted apart from the
    actions' (``reset_timeouts``): in the profile, ``legato profile``, the lake's profile row,
    and said on the attempt's report page."""
    import json
    import os
    import subprocess
    import sys

    import orjson

    from legato_pipelines.rollout.profile import profile
    from legato_pipelines.store.lake_tables import Lineage, profile_table
    from legato_pipelines.view import write_report

    tasks = load_tasks(fake_tasks(2, success=1.0))
    policy = PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="s")
    collect(tasks, policy, tmp_path, desktops=1, desktop=DesktopConfig(), group=2, max_steps=2)
    lines = (tmp_path / "rollouts.jsonl").read_bytes().splitlines()
    record = orjson.loads(lines[0])
    record["reset"]["timed_out"] = True  # as a local desktop writes it when GIMP is slow
    lines[0] = orjson.dumps(record)
    (tmp_path / "rollouts.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    summary = profile(tmp_path)
    assert summary["reset_timeouts"] == {"count": 1, "share": 1 / len(lines)}
    assert summary["ready_timeouts"]["count"] == 0  # the actions' count is apart
    row = profile_table(summary, Lineage("s", "t", "r")).to_pylist()[0]
    assert (row["reset_timeouts"], row["ready_timeouts"]) == (1, 0)
    shown = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "profile", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    assert "ready waits at their cap" in shown.stdout and "resets 1 (25%)" in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "profile", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(as_json.stdout)["reset_timeouts"]["count"] == 1
    page = write_report(tmp_path).rollout_page(record["rollout_id"]).read_text()
    assert "the ready wait hit its cap" in page
