"""One ``collect`` of OSWorld tasks on one local desktop, answered by a scripted policy: what the
tests that solve real tasks by scripted actions share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from legato_pipelines import DesktopConfig, PolicyConfig, collect, read_records
from legato_pipelines.policy.scripted import ScriptedPolicyServer


def collect_scripted(
    tasks, script: dict, out: Path, options: dict[str, Any], max_steps: int
) -> dict[str, dict]:
    """Run ``tasks`` once each (group 1) on one ``local`` desktop with desktop ``options``,
    the policy answering from ``script`` (:class:`ScriptedPolicyServer`'s format, written next
    to ``out``); the records by task id."""
    (out.parent / f"{out.name}.json").write_bytes(orjson.dumps(script))
    desktop = DesktopConfig(backend="local", options=options)
    with ScriptedPolicyServer(script=out.parent / f"{out.name}.json") as server:
        policy = PolicyConfig(base_url=server.url, model=server.model, version="v1")
        collect(tasks, policy, out, desktops=1, desktop=desktop, group=1, max_steps=max_steps)
    return {r["task_id"]: r for r in read_records(out)}
