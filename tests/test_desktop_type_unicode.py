"""``type`` with text pyautogui cannot type (``ß``, ``€``, Cyrillic, CJK) through OSWorld's base
API arrives exactly, or the action says what was not typed.

OSWorld runs a ``type`` action as ``pyautogui.typewrite(...)`` in ``python -c`` on the VM
(``/execute``); pyautogui's X11 table has printable ASCII only and silently skips anything
else (``Spaß øé € naïve`` arrived as ``Spa   nave``, exit 0). Real parts: a local desktop
server on Xvfb speaking OSWorld's in-VM API, driven as an OSWorld VM server by URL
(``VMServerDesktop``: ``/execute`` with the desktop's own python and pyautogui) and by OSWorld's
own ``DesktopEnv.step`` (the osworld backend, provider ``local``); the text is read back from
real text widgets (l3afpad saved with ctrl+s, xterm writing a file).
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from legato_pipelines import PolicyConfig, collect_async, read_records
from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.client import DesktopClient
from legato_pipelines.desktops.server.vmserver import VMServerDesktop
from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.desktop_local_support import RunningServer, needs_apps, needs_xvfb, server_fixture
from tests.osworld_backend_support import needs_vm_python
from tests.vmserver_support import BaseApiProxy

pytestmark = [needs_xvfb, needs_apps, needs_vm_python, pytest.mark.desktop]

TEXT = "Spaß øé € naïve Привет 你好 a<b ok"


server = server_fixture(1024, 768)


@pytest.fixture
async def vm(server):
    """The local desktop server driven through OSWorld's base API (as a VM server by URL)."""
    client = DesktopClient(server.url, server.token)
    await client.reset()
    desktop = VMServerDesktop(
        "vm", client, DesktopConfig(backend="local"), (1024, 768), reconnect_s=1
    )
    await desktop.attach()
    yield desktop
    await desktop.close()


async def file_when_written(client, path: str, attempts: int = 100) -> bytes | None:
    for _ in range(attempts):
        data = await client.file(path)
        if data:
            return data
        await asyncio.sleep(0.05)
    return None


async def act(desktop, action: Action) -> dict | None:
    facts = await desktop.act(action)
    await desktop.wait_after_action(action)
    return facts


async def test_l3afpad_receives_the_exact_text(vm):
    client = vm.client
    await client.upload("~/typed.txt", b"")
    await client.launch(["l3afpad", "~/typed.txt"])
    await vm.wait_after_reset()
    facts = await act(vm, Action("type", text=TEXT + "\nsecond line"))
    assert not facts  # nothing left untyped
    await act(vm, Action("key", keys=("ctrl", "s")))
    assert (await client.file("~/typed.txt")).decode() == TEXT + "\nsecond line"


async def test_xterm_receives_the_exact_text(vm):
    client = vm.client
    await client.launch(["xterm", "-e", "sh", "-c", "head -n 1 > ~/line.txt"])
    await vm.wait_after_reset()
    facts = await act(vm, Action("type", text=TEXT + "\n"))
    assert not facts
    assert (await file_when_written(client, "~/line.txt")).decode() == TEXT + "\n"


#: Fills every keycode the keymap leaves empty (a desktop whose keymap has no room left),
#: run with the desktop's own python and python-xlib.
FILL_KEYMAP = (
    "from Xlib.display import Display\n"
    "d = Display(); lo = d.display.info.min_keycode\n"
    "m = d.get_keyboard_mapping(lo, d.display.info.max_keycode - lo + 1)\n"
    "for i, syms in enumerate(m):\n"
    "    if not any(syms): d.change_keyboard_mapping(lo + i, [(0xFFC9, 0xFFC9)])\n"  # F12
    "d.sync()\n"
)
STEPS = [
    {"action": "type", "text": TEXT},
    {"action": "key", "keys": ["ctrl", "s"]},
    {"action": "terminate", "status": "success"},
]


def typing_task() -> dict:
    return {
        "id": "type-unicode",
        "instruction": f"Type {TEXT} and save.",
        "config": [
            {"type": "execute", "parameters": {"command": "printf '' > typed.txt", "shell": True}},
            {"type": "open", "parameters": {"path": "~/typed.txt"}},
        ],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "cat typed.txt", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": TEXT}},
        },
    }


def qwen(step: dict) -> str:
    call = orjson.dumps({"name": "computer_use", "arguments": step}).decode()
    return f"Action: {step['action']}.\n<tool_call>\n{call}\n</tool_call>"


@pytest.mark.slow
@pytest.mark.parametrize("keymap_full", [False, True])
async def test_engine_records_what_was_not_typed(tmp_path, monkeypatch, keymap_full):
    """Through the engine on a VM server by URL: the text arrives (reward 1), or, on a desktop
    whose keymap has no empty keycode left, the action says which characters did not arrive
    (``not_typed``) and the profile counts it, with the honest reward 0."""
    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    server = RunningServer(width=1024, height=768)
    try:
        if keymap_full:
            client = server.client()
            out = await client.execute(["python3", "-c", FILL_KEYMAP])
            await client.aclose()
            assert out["returncode"] == 0, out
        (tmp_path / "tasks.json").write_bytes(
            orjson.dumps([{"task_id": "type-unicode", "config": typing_task()}])
        )
        script = {"tasks": {typing_task()["instruction"]: [qwen(s) for s in STEPS]}}
        with (
            BaseApiProxy(server.url, server.token) as proxy,
            ScriptedPolicyServer(flavor="vllm", script=script) as policy,
        ):
            summary = await collect_async(
                tmp_path / "tasks.json",
                PolicyConfig(base_url=policy.url, model=policy.model),
                tmp_path / "run",
                desktops=1,
                desktop=DesktopConfig(backend="local", options={"urls": [proxy.url]}),
                group=1,
                max_steps=5,
            )
    finally:
        server.stop()
    (record,) = read_records(tmp_path / "run")
    typed = record["steps"][0]["actions"][0]
    assert typed["action"] == "type"
    if keymap_full:
        assert record["reward"] == 0.0
        assert typed["not_typed"] == "ßøé€ïПривет你好"
        assert summary["not_typed_actions"] == 1
    else:
        assert record["reward"] == 1.0 and "not_typed" not in typed
        assert summary["not_typed_actions"] == 0


@pytest.mark.slow
async def test_osworld_desktop_env_step_types_the_exact_text(tmp_path):
    """OSWorld's own ``DesktopEnv.step`` (its ``<`` rewrite included) runs the rendered code."""
    from legato_pipelines.desktops import open_desktops
    from legato_pipelines.tasks import Task
    from tests.osworld_backend_support import osworld_python

    config = DesktopConfig(
        backend="osworld",
        options={
            "osworld_python": osworld_python(),
            "provider": "local",
            "cache_dir": str(tmp_path / "cache"),
            "work_dir": str(tmp_path / "work"),
        },
    )
    task = Task("type-unicode", None, typing_task(), "inline")
    [desktop] = await open_desktops(config, 1)
    try:
        await desktop.reset(task)
        await desktop.wait_after_reset()
        assert not await act(desktop, Action("type", text=TEXT))
        await act(desktop, Action("key", keys=("ctrl", "s")))
        evaluation = await desktop.evaluate(task)
        assert (evaluation.reward, evaluation.error) == (1.0, None)
    finally:
        await desktop.close()
