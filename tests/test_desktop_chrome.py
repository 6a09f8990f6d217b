"""``google-chrome`` inside a sandboxed local desktop, as OSWorld's chrome configs drive it:
launched by a setup step with ``--remote-debugging-port=1337``, bridged to 9222 by ``socat``,
profile in ``~/.config/google-chrome``, stopped by ``pkill chrome`` and launched again."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

import pytest

from legato_pipelines import DesktopConfig
from legato_pipelines.desktops.server import chrome
from legato_pipelines.desktops.server.desktop import open_local_desktops
from legato_pipelines.tasks import Task
from tests.desktop_local_support import needs_xvfb

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(not chrome.available(), reason="needs chromium (apt-get install chromium)"),
    pytest.mark.skipif(shutil.which("socat") is None, reason="needs socat (apt-get install socat)"),
]
CDP_TIMEOUT_S = 30.0
#: GET a URL from inside the desktop: the JSON answer, or exit 1.
FETCH = (
    "import sys, urllib.request;"
    "print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
)
#: OSWorld's chrome tasks start with these two steps (e.g. chrome/bb5e4c0d, 88 configs).
SETUP = [
    {
        "type": "launch",
        "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]},
    },
    {
        "type": "launch",
        "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]},
    },
]


def chrome_task(setup: list[dict] = SETUP) -> Task:
    config = {
        "id": "chrome-cdp",
        "instruction": "Nothing.",
        "config": setup,
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo ok", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "ok\n"}},
        },
    }
    return Task(task_id="chrome-cdp", domain="chrome", config=config, source="inline")


async def get_json(desktop, url: str) -> dict:
    """GET ``url`` from inside the desktop until it answers (at most ``CDP_TIMEOUT_S``)."""
    deadline = time.monotonic() + CDP_TIMEOUT_S
    while True:
        out = await desktop.client.execute(["python3", "-c", FETCH, url])
        if out["returncode"] == 0:
            return json.loads(out["output"])
        assert time.monotonic() < deadline, f"{url} did not answer: {out['error'][-500:]}"
        await asyncio.sleep(0.2)


async def test_google_chrome_answers_cdp_through_the_socat_bridge_and_relaunches():
    # a loopback of its own: on the host network, 1337 and 9222 are the host's ports, which
    # another desktop (or test) may hold (docs/local-desktop.md §12)
    config = DesktopConfig(
        backend="local", screen_width=1280, screen_height=720, options={"network": "none"}
    )
    (desktop,) = await open_local_desktops(config, 1)
    try:
        await desktop.reset(chrome_task())
        assert desktop.setup_failures == []
        version = await get_json(desktop, "http://127.0.0.1:9222/json/version")
        assert version["Browser"].startswith("Chrome/")
        assert version["webSocketDebuggerUrl"].startswith("ws://127.0.0.1:9222/devtools/browser/")
        # no first-run window: the one tab is a new tab; the profile is where OSWorld reads it
        tabs = await get_json(desktop, "http://127.0.0.1:9222/json/list")
        pages = [t["url"] for t in tabs if t["type"] == "page"]
        assert len(pages) == 1 and pages[0].startswith("chrome://new"), pages
        assert len(await desktop.client.windows()) == 1  # no dialog
        profile = await desktop.client.execute(
            "test -d ~/.config/google-chrome/Default", shell=True
        )
        assert profile["returncode"] == 0
        # the browser's processes are named chrome, so OSWorld's `pkill chrome` stops it ...
        names = {p["comm"] for p in (await desktop.client.processes())["task"]}
        assert "chrome" in names and "chromium" not in names
        assert (await desktop.client.execute(["pkill", "chrome"]))["returncode"] == 0
        deadline = time.monotonic() + 10
        while "chrome" in {p["comm"] for p in (await desktop.client.processes())["task"]}:
            assert time.monotonic() < deadline, "chrome survived pkill chrome"
            await asyncio.sleep(0.1)
        # ... and a relaunch answers on the same bridge with a new browser
        await desktop.client.launch(["google-chrome", "--remote-debugging-port=1337"])
        again = await get_json(desktop, "http://127.0.0.1:9222/json/version")
        assert again["webSocketDebuggerUrl"] != version["webSocketDebuggerUrl"]
        # nothing of the browser outlives a reset, its profile neither
        assert await desktop.reset(chrome_task([])) == "fast"
        names = {p["comm"] for p in (await desktop.client.processes())["task"]}
        assert not names & {"chrome", "chrome_crashpad", "socat"}
        gone = await desktop.client.execute("test -e ~/.config/google-chrome", shell=True)
        assert gone["returncode"] == 1
    finally:
        await desktop.close()


#: Inside the desktop: a bridge that closes each connection first (so its end of the
#: connection waits in TIME_WAIT on the listening port), one connection, then the bridge gone.
CLOSED_FIRST = """
import socket, subprocess, sys, time
port = sys.argv[1]
bridge = subprocess.Popen(["socat", f"tcp-listen:{port},fork", "exec:true"])
for _ in range(100):
    try:
        conn = socket.create_connection(("127.0.0.1", int(port)), timeout=2)
        break
    except OSError:
        time.sleep(0.05)
assert conn.recv(1) == b""  # socat closed first
time.sleep(0.2)
conn.close()
bridge.kill()
bridge.wait()
"""


async def test_a_bridge_listens_again_while_the_last_ones_connections_wait_in_time_wait():
    """A task's ``socat tcp-listen:9222`` right after another task's bridge: its closed
    connections hold the port in TIME_WAIT for 60 s (a VM starts each task from a snapshot, a
    local desktop keeps its network stack), so the desktop's socat adds ``reuseaddr`` (a port
    of its own here: the test runs beside others on the host network)."""
    config = DesktopConfig(backend="local", options={"network": "none"})
    [desktop] = await open_local_desktops(config, 1)
    try:
        port = "19222"
        done = await desktop.client.execute(["python3", "-c", CLOSED_FIRST, port])
        assert done["returncode"] == 0, done
        waiting = await desktop.client.execute(
            f"ss -tan state time-wait '( sport = :{port} )'", True
        )
        assert f":{port}" in waiting["output"], waiting  # the bridge's end waits in TIME_WAIT
        again = await desktop.client.execute(
            f"timeout 1 socat tcp-listen:{port} exec:true; echo exit=$?", True
        )
        assert "exit=124" in again["output"], again  # it listened until the timeout
        assert "Address already in use" not in again["output"] + again["error"]
    finally:
        await desktop.close()
