"""Local desktops behave like OSWorld's VM for the apps a task starts: Ctrl+Alt+T opens a
terminal inside the sandbox (GNOME's key; OSWorld's ``os`` tasks rely on it), and the app a
task's setup launched is waited for and never taken for a popup (GIMP's main window maps
seconds after its splash, after the screen first settled).

Real parts: a sandboxed desktop server on Xvfb, gnome-terminal and GIMP, pyautogui run inside
the desktop by ``/execute`` (what OSWorld's commands do), OSWorld's own GIMP task config
(``tests/data/osworld/gimp/d52d6308-*.json``, unmodified) reset on the local backend.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import orjson
import pytest

from legato_pipelines import DesktopConfig
from legato_pipelines.actions import Action
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.server import apps
from legato_pipelines.tasks import Task
from tests.desktop_local_support import client_fixture, needs_apps, needs_xvfb, server_fixture

pytestmark = [needs_xvfb, needs_apps, pytest.mark.desktop]
needs_terminal = pytest.mark.skipif(
    shutil.which("gnome-terminal") is None or apps.installed_apps().isdisjoint({"os"}),
    reason="needs gnome-terminal and the desktop session bus (dbus-daemon, dconf)",
)
needs_pyautogui = pytest.mark.skipif(
    not apps.desktop_python_has_pyautogui(), reason="the desktops' python lacks pyautogui"
)

OSWORLD = Path(__file__).resolve().parents[1] / "tests" / "data" / "osworld"
GIMP_TASK = next((OSWORLD / "gimp").glob("d52d6308-*.json"))
HOTKEY = "import pyautogui; pyautogui.hotkey('ctrl', 'alt', 't')"

server = server_fixture(1280, 720)
client = client_fixture()


async def _windows_of(client, cls: str, timeout_s: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [w for w in await client.windows() if w["class"] == cls]
        if found:
            return found
        await asyncio.sleep(0.2)
    return []


def _ns(pid: int) -> tuple[str, str]:
    return os.readlink(f"/proc/{pid}/ns/mnt"), os.readlink(f"/proc/{pid}/ns/pid")


@needs_terminal
@needs_pyautogui
async def test_ctrl_alt_t_opens_gnome_terminal_inside_the_sandbox(server, client):
    # an app started the /setup/launch way: the namespaces every launched app shares
    await client.launch(["xterm", "-title", "Reference"])
    (xterm,) = await _windows_of(client, "XTerm")
    assert xterm["launched"] and xterm["pid"]
    sandboxed = _ns(xterm["pid"])
    assert sandboxed != _ns(os.getpid())  # really another mount and pid namespace

    # OSWorld's way: pyautogui inside the desktop, XTest on the display
    done = await client.execute(["python", "-c", HOTKEY])
    assert done["returncode"] == 0, done
    (terminal,) = await _windows_of(client, "Gnome-terminal")
    assert _ns(terminal["pid"]) == sandboxed
    # the server's input path (also XTest): one more terminal window; the action's wait
    # waited for it as for a launch
    await client.act(Action("key", keys=("ctrl", "alt", "t")))
    result = await client.wait("action")
    assert result["changed"] and not result["timed_out"]
    assert len([w for w in await client.windows() if w["class"] == "Gnome-terminal"]) == 2

    await client.reset()
    assert await client.windows() == []
    assert terminal["pid"] not in {p["pid"] for p in (await client.processes())["task"]}
    assert not os.path.exists(f"/proc/{terminal['pid']}")


@pytest.mark.skipif(shutil.which("gimp") is None, reason="needs gimp")
async def test_the_launch_wait_outlasts_the_splash_until_the_main_window(client):
    # a stable window short enough to end during GIMP's splash ("GIMP Startup", type SPLASH):
    # the wait goes on until GIMP maps its main window
    await client.launch(["gimp"])
    result = await client.wait("launch", stable_s=0.05)
    assert not result["timed_out"], result
    titles = [w["title"] for w in await client.windows() if w["launched"]]
    assert any(t.startswith("GNU Image Manipulation Program") for t in titles), titles


@pytest.mark.skipif(shutil.which("gimp") is None, reason="needs gimp")
async def test_a_launched_apps_main_window_has_its_own_cap(client):
    """A loaded machine starts GIMP in more than a reset's cap (issue: d52d6308 timed out at
    10 s with load 13 on 2 cores): a cap far shorter than GIMP's start stands in for that.
    With ``app_window_s`` (Waits.ready_app_window_s) the wait goes on, past the screen's cap,
    until GIMP's main window is up, and does not count as timed out."""
    assert DesktopConfig(options={"ready_app_window_s": 45}).waits.ready_app_window_s == 45
    assert DesktopConfig().waits.ready_app_window_s == 30.0
    await client.launch(["gimp"])
    result = await client.wait("launch", timeout_s=0.3, app_window_s=60)
    assert not result["timed_out"] and result["ready_s"] > 0.3, result
    titles = [w["title"] for w in await client.windows() if w["launched"]]
    assert any(t.startswith("GNU Image Manipulation Program") for t in titles), titles


@pytest.mark.skipif(shutil.which("gimp") is None, reason="needs gimp")
async def test_gimp_launched_by_the_setup_is_up_at_the_first_screenshot_and_no_popup():
    task = Task("gimp", "gimp", orjson.loads(GIMP_TASK.read_bytes()), str(GIMP_TASK))
    (desktop,) = await open_desktops(DesktopConfig(backend="local"), 1)
    try:
        await desktop.reset(task)
        await desktop.wait_after_reset()
        gimp = [w for w in await desktop.client.windows() if w["class"] == "Gimp"]
        main = [w for w in gimp if w["title"].startswith("GNU Image Manipulation Program")]
        assert main and all(w["launched"] for w in gimp), gimp
        await desktop.observe()
        # a window nobody launched, while the policy decides: still a popup
        await desktop.client.execute(
            "(exec xterm -title Updates -e sleep 600) >/dev/null 2>&1 &", shell=True
        )
        assert await _windows_of(desktop.client, "XTerm")
        await desktop.act(Action("key", keys=("tab",)))
        assert desktop.reset_facts["unexpected_windows"] == [
            {"title": "Updates", "wm_class": "XTerm", "when": "first_action", "outcome": "closed"}
        ]
        left = {w["id"] for w in await desktop.client.windows()}
        assert main[0]["id"] in left
    finally:
        await desktop.close()


@pytest.mark.parametrize(
    "command",
    [
        ["xterm", "-title", "Held"],
        # its window is gnome-terminal-server's, a process the session bus starts: not in
        # the launch's process tree (the wait is for a new window, not for the launch's pids)
        pytest.param(["gnome-terminal", "--title", "Held"], marks=needs_terminal),
    ],
    ids=["xterm", "gnome-terminal"],
)
async def test_a_terminal_launch_answers_once_its_window_is_managed(client, command):
    """OSWorld's setups launch a terminal or the editor, then poll ``wmctrl -l`` until its
    window is listed, sleeping 0.3 s between polls (``SetupController._execute_setup``'s
    ``until``). On a busy machine the launch was answered while the window manager had not yet
    managed the window: one launch in three of the local suite's batches paid the sleep
    (issue 18). The answer now waits for the window. A window manager held still (SIGSTOP)
    for 0.4 s stands in for the busy machine: the poll run right after the answer lists the
    window. A program that maps no window is answered at once."""
    if command[0] == "gnome-terminal":  # its first start reads caches from disk: take it here
        await client.launch(["gnome-terminal"])
        assert await _windows_of(client, "Gnome-terminal")
        await client.reset()
    infra = (await client.processes())["infra"]
    (wm,) = [p["pid"] for p in infra if p["comm"] == "openbox"]
    os.kill(wm, signal.SIGSTOP)
    try:
        resumed = asyncio.get_running_loop().call_later(0.4, os.kill, wm, signal.SIGCONT)
        t0 = time.monotonic()
        await client.launch(command)
        answered = time.monotonic() - t0
    finally:
        resumed.cancel()
        os.kill(wm, signal.SIGCONT)
    listed = await client.execute(["wmctrl", "-l"])
    assert listed["returncode"] == 0, listed
    assert "Held" in listed["output"], listed["output"]
    assert answered >= 0.35, answered  # it waited for the window manager

    t0 = time.monotonic()
    await client.launch(["sleep", "30"])  # no window: not waited for
    assert time.monotonic() - t0 < 0.9
