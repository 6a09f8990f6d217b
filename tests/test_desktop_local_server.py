"""The local desktop server on a real Xvfb with real apps, through its HTTP API."""

from __future__ import annotations

import asyncio
import io
import math
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from legato_pipelines.actions import Action
from legato_pipelines.errors import DesktopError
from legato_pipelines.images import png_size
from tests.desktop_local_support import (
    RunningServer,
    client_fixture,
    needs_apps,
    needs_xvfb,
    proc_state,
    server_fixture,
    still_alive,
    zombie_children,
)

pytestmark = [needs_xvfb, pytest.mark.desktop]


server = server_fixture(1024, 768)
client = client_fixture()


async def test_screenshot_is_a_png_of_the_screen_size(client):
    png = await client.screenshot()
    assert png_size(png) == (1024, 768)
    shot = await client.observe()
    assert shot.size == (1024, 768) and png_size(shot.png) == (1024, 768)
    assert await client.screen_size() == (1024, 768)
    assert await client.platform() == "Linux"
    assert (await client.terminal())["status"] == "success"


async def _stable_screen(client):
    """A full-size observation of a screen that did not change around it (two equal grabs)."""
    for _ in range(20):
        first = await client.observe()
        second = await client.observe()
        if first.png == second.png:
            return first
        await asyncio.sleep(0.1)
    raise AssertionError("the screen kept changing")


@needs_apps
async def test_model_size_observation_equals_the_collector_resize_on_a_real_screen(client):
    """On a real Xvfb screen (an editor with text, an xterm, the cursor): the server's
    model-size PNG (/legato/observe?width=&height=) is byte for byte what the collector-side
    path (decode the full PNG, Pillow's default resize, encode) makes of the same screen, for
    the Qwen variants' sizes and a downscale; the full screen stays the server's own PNG."""
    from PIL import Image

    from legato_pipelines.harness import Harness
    from legato_pipelines.harness.resize import ResizeRule, resize_screenshot

    await client.launch(["xterm"])
    await client.launch(["l3afpad"])
    await client.wait("launch")
    await client.act(Action("type", text="model-size screenshots: the same pixels"))
    await client.act(Action("mouse_move", x=300, y=200))
    await client.wait("action")
    rules = [Harness(variant=v).resize_rule for v in ("qwen3vl", "qwen25vl")]
    rules.append(ResizeRule(factor=32, max_pixels=640 * 480))  # a downscale
    sizes = {rule.size(1024, 768) for rule in rules}
    assert (1024, 768) in sizes and len(sizes) == 3  # qwen3vl needs no resize at 1024x768
    for rule in rules:
        size = rule.size(1024, 768)
        full = await _stable_screen(client)
        shot = await client.observe(size)
        assert shot.size == size and shot.complete()
        expected = resize_screenshot(full, rule)
        if size == (1024, 768):
            assert shot.png == full.png  # no resize: the server's own PNG, untouched
            continue
        assert shot.png == expected.png, size
        with Image.open(io.BytesIO(shot.png)) as img:
            assert img.mode == "RGB" and len(img.getcolors(1 << 24)) > 50  # real content


async def test_observe_refuses_a_bad_size(server, client):
    async with httpx.AsyncClient(base_url=server.url, headers=client._http.headers) as raw:
        for query in ("width=100", "width=0&height=10", "width=a&height=2"):
            answer = await raw.get("/legato/observe?" + query)
            assert answer.status_code == 400 and "width" in answer.json()["message"]


async def test_every_route_needs_the_token(server):
    async with httpx.AsyncClient(base_url=server.url) as raw:
        for method, path in (
            ("GET", "/screenshot"),
            ("POST", "/execute"),
            ("GET", "/legato/health"),
            ("POST", "/legato/reset"),
        ):
            assert (await raw.request(method, path)).status_code == 401, path
        assert (
            await raw.get("/legato/health", headers={"Authorization": "Bearer wrong"})
        ).status_code == 401
        assert (
            await raw.get("/legato/health", headers={"X-Legato-Token": server.token})
        ).status_code == 200
        assert (
            await raw.get("/legato/health", headers={"Authorization": f"Bearer {server.token}"})
        ).json()["ok"] is True


async def test_execute_runs_as_the_desktop_user_in_its_home(client):
    health = await client.health()
    out = await client.execute(["sh", "-c", 'id -un; echo "$HOME"; pwd'])
    user, home, cwd = out["output"].split()
    assert out["status"] == "success" and out["returncode"] == 0
    assert (user, home, cwd) == (health["user"], health["home"], health["home"])
    if os.geteuid() == 0:
        assert user != "root"
    # ~/ is expanded in list arguments; a failing command keeps its own return code.
    await client.execute(["touch", "~/made-by-execute"])
    assert await client.file("~/made-by-execute") == b""
    failed = await client.execute("exit 3", shell=True)
    assert failed["returncode"] == 3
    slow = await client.execute("sleep 5", shell=True, timeout=0.5)
    assert slow["status"] == "error" and slow["returncode"] is None


async def test_upload_and_file_round_trip(client):
    await client.upload("~/Documents/deep/data.bin", bytes(range(256)))
    assert await client.file("~/Documents/deep/data.bin") == bytes(range(256))
    assert await client.file("/home/user/Documents/deep/data.bin") == bytes(
        range(256)
    )  # OSWorld's HOME
    assert await client.file("~/missing.txt") is None


@needs_apps
async def test_type_unicode_and_save_in_l3afpad(client):
    text = "Hello, World! é→ ü\nsecond line\tTAB"
    await client.upload("~/notes.txt", b"")
    await client.launch(["l3afpad", "~/notes.txt"])
    launched = await client.wait("launch")
    assert not launched["timed_out"] and launched["changed"]
    await client.act(Action("type", text=text))
    await client.wait("action")
    await client.act(Action("key", keys=("ctrl", "s")))
    await client.wait("action")
    assert (await client.file("~/notes.txt")).decode() == text


@needs_apps
async def test_ready_signal_reports_a_finite_ready_time(client):
    await client.launch(["l3afpad"])
    await client.wait("launch")
    await client.act(Action("type", text="some text to settle"))
    ready = await client.wait("action")  # the default: the X server's drawing reports
    assert not ready["timed_out"] and ready["changed"] and ready["source"] == "damage"
    # the floor once something drew: 3 looks of 20 ms without drawing
    assert math.isfinite(ready["ready_s"]) and 0.06 <= ready["ready_s"] < 5.0
    idle = await client.wait("action")  # nothing drew: the whole stable window (0.15 s)
    assert not idle["changed"] and 0.15 <= idle["ready_s"] < 1.0
    polled = await client.wait("action", source="poll")  # the floor: 3 quiet pairs of 50 ms
    assert polled["source"] == "poll" and 0.15 <= polled["ready_s"] < 1.0


@needs_apps
async def test_newline_in_type_presses_return_in_xterm(client):
    await client.launch(["xterm"])
    await client.wait("launch")
    await client.act(Action("type", text="echo hi > ~/x\n"))
    for _ in range(50):  # the shell writes the file after Return
        data = await client.file("~/x")
        if data is not None:
            break
        await asyncio.sleep(0.05)
    assert data == b"hi\n"


@needs_apps
async def test_keys_reach_the_newest_window_after_a_click_on_the_empty_desktop(client):
    await client.upload("~/focus.txt", b"")
    await client.launch(["l3afpad", "~/focus.txt"])
    await client.wait("launch")
    await client.act(Action("left_click", x=1020, y=764))  # bottom-right corner: empty desktop
    await client.wait("action")
    await client.act(Action("type", text="kept"))
    await client.act(Action("key", keys=("ctrl", "s")))
    await client.wait("action")
    assert await client.file("~/focus.txt") == b"kept"


@needs_apps
async def test_fast_reset_kills_every_task_process_and_restores_home(server, client):
    await client.launch(["l3afpad"])
    await client.launch(["xterm"])
    await client.launch(
        "setsid sh -c 'sleep 300 &' ; nohup sleep 301 >/dev/null 2>&1 &", shell=True
    )
    await client.wait("launch")
    await client.execute(
        "echo junk > ~/junk.txt && echo changed > ~/.config/gtk-3.0/settings.ini", shell=True
    )
    tracked = [p["pid"] for p in (await client.processes())["task"]]
    assert len(tracked) >= 4  # l3afpad, xterm + its shell, the two sleeps

    result = await client.reset()
    assert result["kind"] == "fast" and result["killed"] >= len(tracked)
    survivors = {pid: proc_state(pid) for pid in tracked if proc_state(pid) is not None}
    assert survivors == {}
    assert zombie_children(server.proc.pid) == []
    assert (await client.processes())["task"] == []
    assert await client.file("~/junk.txt") is None
    assert b"gtk-cursor-blink=false" in await client.file("~/.config/gtk-3.0/settings.ini")
    assert (await client.health())["ok"]


#: a process whose main thread ends (pthread_exit) while another thread runs on: shown as a
#: zombie ("Z") though it runs
HALF_ZOMBIE = """
import ctypes, threading, time
threading.Thread(target=lambda: time.sleep(600)).start()
time.sleep(0.2)
ctypes.CDLL(None).pthread_exit(None)
"""


async def test_a_zombie_leader_with_running_threads_is_killed_by_a_fast_reset(client):
    """A task can leave a process whose main thread has ended and whose other threads run on
    (``/proc`` says ``Z``): it is a task process like any other, the fast reset kills it
    (it was skipped as a zombie: the kill loop timed out after 3 s, a full restart followed)."""
    await client.launch(["python3", "-c", HALF_ZOMBIE])
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        task = (await client.processes())["task"]
        found = [p for p in task if p["comm"] == "python3" and p["state"] == "Z"]
        if found:
            break
        assert asyncio.get_running_loop().time() < deadline, task
        await asyncio.sleep(0.1)
    (half,) = found
    assert len(os.listdir(f"/proc/{half['pid']}/task")) == 2  # the sleeping thread runs on
    reset = await client.reset()
    assert reset["kind"] == "fast" and reset["killed"] >= 1, reset
    assert proc_state(half["pid"]) is None  # gone, and reaped


async def test_a_starting_spare_sandbox_is_never_a_task_process():
    """A fresh desktop starts its spare sandbox in the background, and a revert starts the
    next one: its set-up commands (``mount``, ``mkdir``...) are the sandbox's, never the
    task's. Once they were seen as task processes when one ended between the process table
    and the look below the spare's ``unshare``: the fresh desktop's first reset was then a
    real one (the test below failed so twice in full runs)."""
    fresh = RunningServer(320, 240)
    clients = [fresh.client() for _ in range(2)]
    try:
        seen: list = []

        async def poll(client, until: float) -> int:
            looks = 0
            while asyncio.get_running_loop().time() < until:
                task = (await client.processes())["task"]
                looks += 1
                # a zombie (the old sandbox's init until the reaper's next round) runs nothing
                seen.extend(p for p in task if p["state"] != "Z")
            return looks

        for round_ in range(3):
            if round_:  # a write outside HOME: the reset reverts, a new spare starts
                script = "echo password | sudo -S sh -c 'echo x > /etc/legato-x'"
                assert (await clients[0].execute(script, shell=True))["returncode"] == 0
                assert (await clients[0].reset())["kind"] == "revert"
            until = asyncio.get_running_loop().time() + 2.0
            looks = await asyncio.gather(*(poll(c, until) for c in clients))
            assert sum(looks) > 50, looks  # it looked all along the spare's start
        assert seen == [], sorted({(p["comm"], p["state"], p["pid"]) for p in seen})
    finally:
        for client in clients:
            await client.aclose()
        fresh.stop()


async def test_a_reset_with_nothing_to_undo_is_skipped_until_the_desktop_is_touched():
    """A desktop that had only reads since it started or since its last reset is in the reset's
    state already: the next fast reset only parks the pointer (a fresh desktop's first reset
    took 0.17-0.22 s of the first attempts' critical path, issue 18). Any other request
    (a command, an action) makes the next reset a real one, and so does one still under way
    when a reset ends (it may act after it)."""
    fresh = RunningServer(320, 240)
    client = fresh.client()
    try:
        assert await client.cursor_position() != (320 - 2, 240 - 2)  # Xvfb's: the middle
        await client.screenshot()
        await client.observe()
        await client.windows()
        skipped = await client.reset()
        assert skipped.get("untouched") is True and skipped["kind"] == "fast", (
            skipped.get("touched_by"),
            skipped,
        )
        assert await client.cursor_position() == (320 - 2, 240 - 2)  # where a reset parks it

        await client.execute("echo junk > ~/junk.txt", shell=True)
        real = await client.reset()
        assert "untouched" not in real and "killed" in real, real
        assert real["touched_by"] == "requests since the last reset", real
        assert await client.file("~/junk.txt") is None

        await client.act(Action("mouse_move", x=10, y=10))
        assert "untouched" not in await client.reset()
        assert (await client.reset()).get("untouched") is True  # the real one left it clean

        # a command whose request is still coming in while a reset runs, and acts after it
        body = b'{"command": "echo late > ~/late.txt", "shell": true}'
        host, port = fresh.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /execute HTTP/1.1\r\nHost: desktop\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {fresh.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[:20]
        )
        await writer.drain()
        await asyncio.sleep(0.3)  # the server has the request and waits for the rest of it
        await client.reset()  # a real one while the request is under way (skipped before it)
        writer.write(body[20:])
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head  # it wrote ~/late.txt after the reset
        writer.close()
        after = await client.reset()
        assert "untouched" not in after, after  # the late write is undone
        assert await client.file("~/late.txt") is None
    finally:
        await client.aclose()
        fresh.stop()


async def test_full_reset_restarts_the_display(client):
    before = await client.health()
    infra = {p["pid"] for p in (await client.processes())["infra"]}
    result = await client.reset(full=True)
    after = await client.health()
    assert result["kind"] == "full" and after["ok"]
    assert after["generation"] == before["generation"] + 1
    assert infra.isdisjoint(p["pid"] for p in (await client.processes())["infra"])
    assert png_size(await client.screenshot()) == (1024, 768)


@needs_apps
async def test_window_routes_and_open_file(client):
    # as OSWorld's server on Linux (wmctrl's status unread): no window to activate is no error
    await client.activate_window("no such window")
    await client.close_window("no such window")
    await client.upload("~/Documents/report.txt", b"quarterly report")
    await client.open_file("~/Documents/report.txt")
    assert "report.txt" in await client.accessibility()
    await client.activate_window("REPORT", strict=False)
    await client.close_window("l3afpad.L3afpad", by_class=True)
    for _ in range(40):
        if "report.txt" not in await client.accessibility():
            break
        await asyncio.sleep(0.05)
    assert "report.txt" not in await client.accessibility()


async def test_pointer_actions_and_bad_input(client):
    await client.act(Action("mouse_move", x=100, y=200))
    assert await client.cursor_position() == (100, 200)
    await client.act(Action("left_click_drag", x=300, y=250))
    assert await client.cursor_position() == (300, 250)
    await client.act(Action("scroll", x=50, y=60, pixels=-3))
    assert await client.cursor_position() == (50, 60)
    with pytest.raises(DesktopError, match="unknown key name"):
        await client.act(Action("key", keys=("ctrl", "nosuchkey")))
    with pytest.raises(DesktopError, match="needs screen coordinates"):
        await client.act(Action("left_click"))
    with pytest.raises(DesktopError, match=r"field 'mode' must be one of .*'apps'"):
        await client.wait("sometime")


async def test_a_dead_display_is_restarted_by_the_next_reset(client):
    xvfb = next(p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "Xvfb")
    os.kill(xvfb, 9)
    for _ in range(100):
        if not (await client.health())["ok"]:
            break
        await asyncio.sleep(0.02)
    assert not (await client.health())["ok"]
    with pytest.raises(DesktopError) as failure:
        await client.screenshot()
    assert failure.value.kind == "crash"
    result = await client.reset()  # asked for fast, but the display is gone: full restart
    assert result["kind"] == "full" and (await client.health())["ok"]
    assert png_size(await client.screenshot()) == (1024, 768)


@pytest.mark.skipif(shutil.which("soffice") is None, reason="libreoffice not installed")
async def test_a_prebuilt_libreoffice_profile_is_in_the_baseline_by_default(tmp_path):
    """No ``--prebuild``: LibreOffice's profile, built by soffice itself into the server user's
    cache, is in the baseline HOME with the baseline's settings merged in, and a reset brings
    it back."""
    server = RunningServer(width=640, height=480, env={"XDG_CACHE_HOME": str(tmp_path)})
    try:
        built = list((tmp_path / "legato" / "app-profiles").glob("libreoffice-*"))
        assert len(built) == 1 and (built[0] / ".config/libreoffice/4/user").is_dir()
        client = server.client()
        registry = await client.file("~/.config/libreoffice/4/user/registrymodifications.xcu")
        assert b'"ShowTipOfTheDay"' in registry and b'"FirstRun"' in registry
        # soffice built it (it writes these itself), and the baseline's settings were kept
        assert b'"ooSetupInstCompleted"' in registry and b'"AutoPilot"' in registry
        assert await client.file("~/.config/libreoffice/4/user/extensions/buildid")
        await client.execute("rm -rf ~/.config/libreoffice", shell=True)
        await client.reset()
        assert (
            await client.file("~/.config/libreoffice/4/user/registrymodifications.xcu") == registry
        )
        assert (await client.processes())["task"] == []  # the headless soffice is gone
        await client.aclose()
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("soffice") is None, reason="libreoffice not installed")
async def test_a_profile_cache_that_cannot_be_written_fails_only_an_explicit_prebuild(tmp_path):
    """The profile is a default: a cache the server cannot write (here below a regular file)
    leaves the desktop without it, and the server starts; asked for with ``--prebuild
    libreoffice``, the server refuses to start instead."""
    (tmp_path / "file").write_text("")
    broken = {"XDG_CACHE_HOME": str(tmp_path / "file" / "cache")}
    server = RunningServer(width=640, height=480, env=broken)
    try:
        client = server.client()
        assert await client.file("~/.config/libreoffice/4/user/extensions/buildid") is None
        registry = await client.file("~/.config/libreoffice/4/user/registrymodifications.xcu")
        assert b'"FirstRun"' in registry  # the baseline's settings are still there
        await client.aclose()
    finally:
        server.stop()
    refused = subprocess.run(
        [sys.executable, "-m", "legato_pipelines.desktops.server.main", "--width", "640",
         "--height", "480", "--state-dir", str(tmp_path / "state"), "--prebuild", "libreoffice"],
        env=dict(os.environ, **broken, LEGATO_DESKTOP_TOKEN="t"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "LEGATO_DESKTOP_READY" not in refused.stdout
    assert "prebuild libreoffice: cannot use the profile cache" in refused.stderr
    assert "--prebuild none" in refused.stderr  # the way to go on without it


@pytest.mark.skipif(shutil.which("soffice") is None, reason="libreoffice not installed")
async def test_prebuild_none_leaves_only_the_baselines_libreoffice_settings():
    server = RunningServer(width=640, height=480, prebuild=("none",))
    try:
        client = server.client()
        registry = await client.file("~/.config/libreoffice/4/user/registrymodifications.xcu")
        assert b'"FirstRun"' in registry and b'"ooSetupInstCompleted"' not in registry
        assert await client.file("~/.config/libreoffice/4/user/extensions/buildid") is None
        await client.aclose()
    finally:
        server.stop()


def test_an_unsandboxed_server_killed_with_sigkill_takes_its_session_bus_along():
    """``kill -9`` of a desktop server without a sandbox (``--no-sandbox``): Xvfb and openbox
    die with it (their parent-death signal), and so does its session bus now; before, the
    bus was re-parented to init and ran on, one per killed server."""
    from legato_pipelines.desktops.server.procs import descendants, process_table

    server = RunningServer(320, 240, extra_args=("--no-sandbox",))
    try:
        table = process_table()
        below = descendants(server.proc.pid, table)
        watched = {(pid, table[pid].comm) for pid in below}
        assert {"dbus-daemon", "Xvfb", "openbox"} <= {comm for _, comm in watched}, watched
        server.proc.kill()
        server.proc.wait()
        alive = still_alive(watched)
    finally:
        server.stop()
    assert alive == []
