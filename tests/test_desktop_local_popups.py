"""A window nobody asked for (an "updates available" dialog) that pops up right after a reset
is closed before the policy acts on it, and recorded as a fact of the desktop; a window that
appears after the policy's first action is left alone.

Before the fix the popup took the focus, the policy's typing went into it, the attempt scored
0 with status ok and nothing said why. Real parts: a local desktop server on Xvfb, l3afpad
opened by the task's setup, an xterm titled "Updates" started by the setup a moment later in
the background (as a desktop daemon would), the scripted policy server on loopback answering
after a model-like delay, the engine.
"""

from __future__ import annotations

import orjson
import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, read_records
from legato_pipelines.actions import Action
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.tasks import Task
from tests.desktop_local_support import RunningServer, needs_apps, needs_xvfb
from tests.osworld_backend_support import osworld_python, vm_python_ready
from tests.vmserver_support import BaseApiProxy

pytestmark = [needs_xvfb, needs_apps, pytest.mark.desktop]


def popup_task(delay_s: float) -> dict:
    """l3afpad on notes.txt; ``delay_s`` seconds after the setup an "Updates" xterm pops up."""
    popup = f"(sleep {delay_s}; exec xterm -title Updates -e sleep 600) >/dev/null 2>&1 &"
    return {
        "id": "popup",
        "instruction": "Write hello into notes.txt and save it.",
        "config": [
            {"type": "execute", "parameters": {"command": "printf '' > notes.txt", "shell": True}},
            {"type": "open", "parameters": {"path": "~/notes.txt"}},
            {"type": "execute", "parameters": {"command": popup, "shell": True}},
        ],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "cat notes.txt", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "hello"}},
        },
    }


def qwen(arguments: dict) -> str:
    call = orjson.dumps({"name": "computer_use", "arguments": arguments}).decode()
    return f"Action: {arguments['action']}.\n<tool_call>\n{call}\n</tool_call>"


STEPS = [
    qwen({"action": "type", "text": "hello"})
    + "\n"
    + qwen({"action": "key", "keys": ["ctrl", "s"]}),
    qwen({"action": "terminate", "status": "success"}),
]


@pytest.fixture
def backend_config(request, tmp_path, monkeypatch):
    """The desktop config of one backend, all on a real local desktop: ``local`` (XTest on
    the server), ``vm_server`` (the same server as an OSWorld VM server by URL: base API,
    wmctrl over /execute), ``osworld`` (OSWorld's DesktopEnv in a worker, provider local)."""
    kind = request.param
    if kind == "local":
        yield DesktopConfig(backend="local")
        return
    if not vm_python_ready():
        pytest.skip("the desktop's python lacks pyautogui (fix: bash scripts/osworld_venv.sh)")
    if kind == "osworld":
        yield DesktopConfig(
            backend="osworld",
            options={
                "osworld_python": osworld_python(),
                "provider": "local",
                "cache_dir": str(tmp_path / "cache"),
                "work_dir": str(tmp_path / "work"),
            },
        )
        return
    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    server = RunningServer(width=1280, height=720)
    try:
        with BaseApiProxy(server.url, server.token) as proxy:
            yield DesktopConfig(backend="local", options={"urls": [proxy.url]})
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("backend_config", ["local", "vm_server", "osworld"], indirect=True)
async def test_a_popup_during_the_first_model_call_is_closed_and_recorded(tmp_path, backend_config):
    config = popup_task(delay_s=1.0)
    (tmp_path / "tasks.json").write_bytes(orjson.dumps([{"task_id": "popup", "config": config}]))
    script = {"tasks": {config["instruction"]: STEPS}}
    # the model takes 2.5 s per answer: the popup shows up while it decides its first action
    with ScriptedPolicyServer(flavor="vllm", script=script, latency=2.5) as policy:
        summary = await collect_async(
            tmp_path / "tasks.json",
            PolicyConfig(base_url=policy.url, model=policy.model),
            tmp_path / "run",
            desktops=1,
            desktop=backend_config,
            group=1,
            max_steps=4,
        )
    (record,) = read_records(tmp_path / "run")
    # the typing reached the editor the policy saw, not the popup: graded as the policy did
    assert (record["status"], record["reward"]) == ("ok", 1.0)
    assert record["reset"]["unexpected_windows"] == [
        {"title": "Updates", "wm_class": "XTerm", "when": "first_action", "outcome": "closed"}
    ]
    assert summary["unexpected_windows"] == {
        "attempts": 1,
        "by_window": {"XTerm 'Updates' (closed)": 1},
    }


async def test_settle_catches_a_popup_before_the_first_screenshot_later_windows_stay():
    task = Task("popup", None, popup_task(delay_s=0.5), "inline")
    config = DesktopConfig(backend="local", options={"settle_after_reset_s": 1.5})
    (desktop,) = await open_desktops(config, 1)
    try:
        await desktop.reset(task)
        wait = await desktop.wait_after_reset()
        assert wait.wait_s >= 1.5
        await desktop.observe()
        assert desktop.reset_facts["unexpected_windows"] == [
            {"title": "Updates", "wm_class": "XTerm", "when": "handout", "outcome": "closed"}
        ]
        titles = [w["title"] for w in await desktop.client.windows()]
        assert "Updates" not in titles and any("notes.txt" in t for t in titles)
        # after the policy's first action a new window may be its doing: it stays, unrecorded
        await desktop.act(Action("type", text="hello"))
        await desktop.client.launch(["xterm", "-title", "Later"])
        await desktop.client.wait("launch")
        await desktop.observe()
        await desktop.act(Action("key", keys=("ctrl", "s")))
        assert "Later" in [w["title"] for w in await desktop.client.windows()]
        assert len(desktop.reset_facts["unexpected_windows"]) == 1
        # the next reset starts over: no popup this time, no facts
        quiet = Task(
            "quiet", None, {**popup_task(0.5), "config": popup_task(0.5)["config"][:2]}, "inline"
        )
        await desktop.reset(quiet)
        await desktop.wait_after_reset()
        await desktop.observe()
        await desktop.act(Action("type", text="x"))
        assert desktop.reset_facts == {}
    finally:
        await desktop.close()
