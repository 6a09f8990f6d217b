"""A keyboard layout switched inside a local desktop (``setxkbmap de``): typed text stays
exact under the new layout, and the next fast reset restores the layout the desktop started
with, saying so on the record.

Before the fix the server typed with the keymap it read at connection time, so under ``de``
``yz<>`` arrived as ``zy<:``-like garbage, and the layout survived fast resets unflagged.
Real parts: a local desktop server on Xvfb, ``setxkbmap`` run inside the desktop as its user,
xterm writing what it receives to a file, the ``local`` backend's reset.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, read_records
from legato_pipelines.actions import Action
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.desktop_local_support import (
    client_fixture,
    needs_apps,
    needs_xvfb,
    server_fixture,
)

pytestmark = [needs_xvfb, needs_apps, pytest.mark.desktop]

TEXT = "yz<>@{|} Zürich"


server = server_fixture(1024, 768)
client = client_fixture()


async def layout(client) -> str:
    out = await client.execute(["setxkbmap", "-query"])
    assert out["returncode"] == 0, out
    return dict(
        (k.strip(), v.strip())
        for k, _, v in (line.partition(":") for line in out["output"].splitlines())
    )["layout"]


async def typed_line(client, text: str, name: str) -> str:
    """Type ``text`` + Return into an xterm that writes its first line to ``~/<name>``."""
    await client.launch(["xterm", "-e", "sh", "-c", f"head -n 1 > ~/{name}"])
    await client.wait("launch")
    await client.act(Action("type", text=text + "\n"))
    await client.wait("action")
    for _ in range(100):
        data = await client.file(f"~/{name}")
        if data:
            return data.decode()
        await asyncio.sleep(0.05)
    raise AssertionError(f"xterm wrote nothing to ~/{name}")


async def test_text_is_exact_under_a_switched_layout_and_reset_restores_it(client):
    assert await layout(client) == "us"
    assert await typed_line(client, TEXT, "before.txt") == TEXT + "\n"
    out = await client.execute(["setxkbmap", "de"])
    assert out["returncode"] == 0, out
    assert await layout(client) == "de"
    assert await typed_line(client, TEXT, "under-de.txt") == TEXT + "\n"
    reset = await client.reset()
    assert reset["kind"] == "fast"
    assert reset["keyboard_restored"] == "layout de -> us"
    assert await layout(client) == "us"
    assert await typed_line(client, TEXT, "after.txt") == TEXT + "\n"
    again = await client.reset()  # nothing changed since: nothing to restore
    assert "keyboard_restored" not in again


def qwen(arguments: dict) -> str:
    call = orjson.dumps({"name": "computer_use", "arguments": arguments}).decode()
    return f"Action: {arguments['action']}.\n<tool_call>\n{call}\n</tool_call>"


async def test_the_record_says_the_reset_restored_the_layout(tmp_path):
    """Attempt 0's policy switches the layout in a terminal; attempt 1's reset restores it and
    its record (and the profile) say so; both attempts are graded as usual."""
    config = {
        "id": "kb",
        "instruction": "Switch the keyboard to German.",
        "config": [
            {"type": "launch", "parameters": {"command": ["xterm"]}},
            {
                "type": "execute",
                "parameters": {"command": "wmctrl -l", "shell": True, "until": {"stdout": "xterm"}},
            },
        ],
        "evaluator": {
            "func": "check_include_exclude",
            "result": {"type": "vm_command_line", "command": "setxkbmap -query", "shell": True},
            "expected": {"type": "rule", "rules": {"include": ["layout:     de"]}},
        },
    }
    (tmp_path / "tasks.json").write_bytes(orjson.dumps([{"task_id": "kb", "config": config}]))
    steps = [
        qwen({"action": "type", "text": "setxkbmap de\n"}),
        qwen({"action": "terminate", "status": "success"}),
    ]
    with ScriptedPolicyServer(
        flavor="vllm", script={"tasks": {config["instruction"]: steps}}
    ) as policy:
        summary = await collect_async(
            tmp_path / "tasks.json",
            PolicyConfig(base_url=policy.url, model=policy.model),
            tmp_path / "run",
            desktops=1,
            desktop=DesktopConfig(backend="local"),
            group=2,
            max_steps=3,
        )
    records = sorted(read_records(tmp_path / "run"), key=lambda r: r["started_at"])
    assert [r["reward"] for r in records] == [1.0, 1.0]
    assert "keyboard_restored" not in records[0]["reset"]
    assert records[1]["reset"]["keyboard_restored"] == "layout de -> us"
    assert summary["keyboard_restores"] == {"attempts": 1, "by_change": {"layout de -> us": 1}}
