"""``collect`` on the osworld backend (provider ``local``, two desktops) with the scripted
policy server: records, reset kinds and rewards, equal to the ``local`` backend's."""

from __future__ import annotations

import pytest

from legato_pipelines import PolicyConfig, collect, read_records
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.policy.scripted import ScriptedPolicyServer

from .osworld_backend_support import (
    SUITE,
    needs_desktop_apps,
    needs_vm_python,
    osworld_python,
    suite_tasks,
)

TASKS = ("local-term-mkdir", "local-term-count-lines", "local-edit-append")

pytestmark = [pytest.mark.desktop, pytest.mark.slow, needs_desktop_apps, needs_vm_python]


def run(tmp_path, script: str, desktop: DesktopConfig, *, desktops: int, group: int) -> list:
    tasks = [t for t in suite_tasks().values() if t.task_id in TASKS]
    raw = [{"task_id": t.task_id, "domain": t.domain, "config": t.config} for t in tasks]
    out = tmp_path / f"{desktop.backend}-{script}"
    with ScriptedPolicyServer(script=SUITE / "scripts" / f"{script}.json") as server:
        policy = PolicyConfig(base_url=server.url, model=server.model, version="v1")
        collect(raw, policy, out, desktops=desktops, desktop=desktop, group=group, max_steps=5)
    return read_records(out)


def test_collect_on_osworld_desktops_matches_local(tmp_path):
    osworld = DesktopConfig(
        backend="osworld",
        options={
            "osworld_python": osworld_python(),
            "provider": "local",
            "cache_dir": str(tmp_path / "cache"),
            "work_dir": str(tmp_path / "work"),
        },
    )
    good = run(tmp_path, "correct", osworld, desktops=2, group=2)
    assert len(good) == 2 * len(TASKS)
    assert {r["status"] for r in good} == {"ok"}
    assert {r["reward"] for r in good} == {1.0}
    assert {r["desktop"] for r in good} == {"osworld-0", "osworld-1"}
    assert {r["reset"]["kind"] for r in good} == {"fast"}
    assert all(r["reset"]["ready_s"] is not None and r["n_steps"] >= 2 for r in good)
    logs = sorted(p.name for p in (tmp_path / "work").iterdir() if p.suffix == ".log")
    assert logs == ["osworld-0.log", "osworld-1.log"]  # DesktopEnv's output, not the console

    bad = {r["task_id"]: r["reward"] for r in run(tmp_path, "wrong", osworld, desktops=2, group=1)}
    local = DesktopConfig(backend="local")
    expected = {
        r["task_id"]: r["reward"] for r in run(tmp_path, "wrong", local, desktops=1, group=1)
    }
    assert bad == expected
    assert all(v < 1.0 for v in bad.values())
