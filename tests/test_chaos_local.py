"""Chaos on real desktops (issue 12): a batch on two sandboxed Xvfb desktops where, at random,
screenshots come back truncated, a window pops up right after reset, the keyboard layout is
switched inside the desktop and the desktop server is killed mid-attempt. The batch never
aborts, every logical attempt is accounted for exactly once, no attempt is scored on a desktop
that lied (every ``ok`` attempt of the correct script scores 1.0: text typed into the right
window under the right layout), and the profile shows the env facts per kind."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
from collections import Counter
from typing import Any

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, load_tasks, read_records
from legato_pipelines.desktops import open_desktops
from legato_pipelines.images import Screenshot
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.desktop_local_support import LOCAL_SUBSET, LOCAL_SUITE, local_subset

SUITE, TASKS = LOCAL_SUITE, LOCAL_SUBSET

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(a) for a in ("Xvfb", "openbox", "xterm", "l3afpad", "xmessage")),
        reason="needs Xvfb, apps and xmessage (x11-utils)",
    ),
]


class ChaosDesktop:
    """A real local desktop with faults injected around it (the engine drives it as any other
    desktop). ``events`` counts what was injected, by kind."""

    def __init__(self, inner: Any, seed: int, kill_at: int | None = None):
        self.inner = inner
        self.rng = random.Random(seed)
        self.kill_at = kill_at  # the action count at which the server surely dies once
        self.acts = 0
        self.events: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def reset(self, task, *, seed: int = 0) -> str:
        return await self.inner.reset(task, seed=seed)

    async def wait_after_reset(self):
        wait = await self.inner.wait_after_reset()
        # right after the reset, before the policy's first look: a dialog takes the focus, or
        # something switches the keyboard layout
        roll = self.rng.random()
        if roll < 0.3:
            self.events["popup"] += 1
            await self.inner.client.execute(
                "(xmessage -name updates -center 'Updates available' >/dev/null 2>&1 &) ;"
                " for i in $(seq 50); do xdotool search --name updates >/dev/null && break;"
                " sleep 0.05; done",
                shell=True,
            )
        elif roll < 0.5:
            self.events["layout"] += 1
            await self.inner.client.execute("setxkbmap de", shell=True)
        return wait

    async def observe(self) -> Screenshot:
        shot = await self.inner.observe()
        if self.rng.random() < 0.08:
            self.events["truncated"] += 1
            return Screenshot(shot.png[: len(shot.png) // 2], shot.width, shot.height)
        return shot

    async def act(self, action) -> None:
        self.acts += 1
        if (self.acts == self.kill_at or self.rng.random() < 0.03) and self.inner.server:
            self.events["killed"] += 1
            os.kill(self.inner.server.pid, signal.SIGKILL)
        await self.inner.act(action)

    async def wait_after_action(self, action):
        return await self.inner.wait_after_action(action)

    async def wait_before_eval(self):
        return await self.inner.wait_before_eval()

    async def evaluate(self, task, *, last_action_fail: bool = False):
        return await self.inner.evaluate(task, last_action_fail=last_action_fail)

    async def recover(self) -> None:
        await self.inner.recover()

    async def close(self) -> None:
        await self.inner.close()


async def test_chaos_batch_accounts_for_every_attempt(tmp_path):
    config = DesktopConfig(backend="local")
    inner = await open_desktops(config, 2)
    pool = [
        ChaosDesktop(d, seed=12 + i, kill_at=4 if i == 0 else None) for i, d in enumerate(inner)
    ]
    try:
        with ScriptedPolicyServer(
            flavor="vllm", script=SUITE / "scripts" / "correct.json"
        ) as server:
            summary = await collect_async(
                load_tasks(local_subset(tmp_path)),
                PolicyConfig(base_url=server.url, model=server.model),
                tmp_path / "run",
                desktop_pool=pool,
                desktop=config,
                group=3,
                max_steps=8,
                env_retries=4,
            )
    finally:
        await asyncio.gather(*(d.close() for d in pool))
    events = sum((d.events for d in pool), Counter())
    records = read_records(tmp_path / "run")

    # the chaos happened, every kind of it
    assert {"popup", "layout", "truncated", "killed"} <= set(events), events
    # no abort, nothing lost, nothing counted twice
    assert summary["missing"] == 0 and summary["groups"]["closed"] == len(TASKS), [
        (r["task_id"], r["attempt"], r["status"], r.get("error")) for r in records
    ]
    assert len(records) == summary["scheduled"] + summary["retries"]
    finals = Counter((r["task_id"], r["attempt"]) for r in records if r["status"] != "retried")
    assert set(finals.values()) == {1} and len(finals) == summary["scheduled"]
    # the correct script scores 1 on every desktop that did not lie (popups closed, layouts
    # restored and typing exact before the policy saw the screen)
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all(r["reward"] == 1.0 for r in ok), [
        (r["task_id"], r["reward"], r.get("reset")) for r in ok if r["reward"] != 1.0
    ]
    # the profile shows the env facts per kind
    # every popup was closed before the policy acted on it, and said so
    assert summary["unexpected_windows"]["attempts"] == events["popup"]
    # a layout flipped during an attempt is the desktop's to restore at the next reset
    assert summary["keyboard_restores"]["attempts"] >= 1
    kinds = summary["env_failure_kinds"]
    assert kinds.get("unexpected", 0) >= events["truncated"] > 0  # half a PNG: that attempt only
    assert sum(kinds.values()) == summary["env_failures"]
    assert set(kinds) - {"unexpected"}, kinds  # the killed server: a transport failure or crash
    retried = [r for r in records if r["status"] == "retried"]
    assert all(r["error"]["kind"] == "env" for r in retried)
