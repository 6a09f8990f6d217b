"""The session D-Bus with dconf of every local desktop: ``gsettings set`` persists across
processes, in HOME, so a reset undoes it; OSWorld's gsettings tasks grade for real. Real
sandboxed servers on real Xvfb."""

from __future__ import annotations

import json
import os

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, load_tasks
from legato_pipelines.desktops.server import dbus_session
from legato_pipelines.desktops.server.desktop import open_local_desktops
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.desktop_local_support import RunningServer, needs_xvfb, server_fixture
from tests.desktop_sandbox_support import osworld_task
from tests.osworld_backend_support import needs_vm_python
from tests.osworld_data import OSWORLD

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(
        bool(dbus_session.missing()),
        reason=f"needs {' '.join(dbus_session.missing())} (scripts/setup.sh installs them)",
    ),
]
LOCK = "org.gnome.desktop.screensaver lock-enabled"
A4D98375 = "a4d98375-215b-4a4d-aee9-3d4370fccc41"  # "automatically locked after I leave"


server = server_fixture(640, 480)


async def sh(server: RunningServer, command: str) -> str:
    client = server.client()
    try:
        out = await client.execute(command, shell=True)
    finally:
        await client.aclose()
    assert out["returncode"] == 0, out
    return out["output"]


async def test_gsettings_persist_in_home_and_a_reset_restores_the_baseline(server):
    # the baseline: screen lock and idle off, as OSWorld's VM; the bus where OSWorld's configs
    # export it themselves (os task ec4e3f68)
    assert await sh(server, f"gsettings get {LOCK}") == "false\n"
    assert await sh(server, "gsettings get org.gnome.desktop.session idle-delay") == "uint32 0\n"
    assert await sh(server, "echo $DBUS_SESSION_BUS_ADDRESS") == "unix:path=/run/user/1000/bus\n"
    # a write in one process is read by the next, and lands in ~/.config/dconf
    await sh(server, "gsettings set org.gnome.desktop.notifications show-banners false")
    assert await sh(server, "gsettings get org.gnome.desktop.notifications show-banners") == (
        "false\n"
    )
    assert await sh(server, "test -s ~/.config/dconf/user && echo yes") == "yes\n"
    # what OSWorld's os tasks read exists (gsettings-desktop-schemas, GNOME Shell's and the
    # settings daemon's schemas), and their evaluators' helpers (bc)
    for key in (
        "org.gnome.shell favorite-apps",
        "org.gnome.settings-daemon.plugins.power idle-dim",
        "org.gnome.desktop.a11y.magnifier mag-factor",
        "org.gnome.desktop.interface text-scaling-factor",
    ):
        assert await sh(server, f"gsettings get {key}"), key
    assert await sh(server, "echo '1.25 >= 1.2' | bc -l") == "1\n"
    client = server.client()
    try:
        before = {
            p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "dbus-daemon"
        }
        result = await client.reset()
        after = await client.processes()
        health = await client.health()
    finally:
        await client.aclose()
    assert result["kind"] == "fast" and result["bus_s"] < 1.0
    assert health["session_bus"] == {"address": "unix:path=/run/user/1000/bus", "running": True}
    assert after["task"] == []  # dconf-service was the task's; the bus is infrastructure
    restarted = {p["pid"] for p in after["infra"] if p["comm"] == "dbus-daemon"}
    assert restarted and restarted.isdisjoint(before)  # each attempt gets a fresh bus
    assert await sh(server, "gsettings get org.gnome.desktop.notifications show-banners") == (
        "true\n"
    )


@needs_vm_python
async def test_osworld_a4d98375_scores_0_doing_nothing_and_1_after_turning_the_lock_on():
    """OSWorld's os task a4d98375: setup turns the auto-lock off (gsettings), the evaluator reads
    it back with ``gsettings get``. With GSettings in memory it scored 1.0 for doing nothing."""
    task = osworld_task("a4d98375")
    config = DesktopConfig(backend="local", screen_width=1280, screen_height=720)
    (desktop,) = await open_local_desktops(config, 1)
    try:
        await desktop.reset(task)
        assert desktop.setup_failures == []
        assert (await desktop.evaluate(task)).reward == 0.0
        # what the policy does (in a terminal, or OSWorld's Settings app)
        on = await desktop.client.execute(f"gsettings set {LOCK} true", shell=True)
        assert on["returncode"] == 0, on
        assert (await desktop.evaluate(task)).reward == 1.0
        # the next attempt starts from the task's setup again
        await desktop.reset(task)
        assert (await desktop.evaluate(task)).reward == 0.0
    finally:
        await desktop.close()


@needs_vm_python
async def test_osworld_a4d98375_through_the_engine_doing_nothing_scores_0(tmp_path):
    """The engine on the real config with the scripted policy server: the policy terminates at
    once, the attempt is graded 0 (it was 1.0 when gsettings writes went to a memory backend)."""
    tasks_path = tmp_path / "tasks.json"
    tasks_path.write_text(json.dumps([{"task_id": A4D98375, "domain": "os"}]))
    done = (
        'Action: The task is done.\n<tool_call>\n{"name": "computer_use", "arguments": '
        '{"action": "terminate", "status": "success"}}\n</tool_call>'
    )
    out = tmp_path / "run"
    with ScriptedPolicyServer(flavor="vllm", script={"default": [done]}) as policy:
        await collect_async(
            load_tasks(tasks_path, osworld=OSWORLD),
            PolicyConfig(base_url=policy.url, model=policy.model),
            out,
            desktops=1,
            desktop=DesktopConfig(backend="local", screen_width=1280, screen_height=720),
            group=1,
            max_steps=2,
        )
    (record,) = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert record["status"] == "ok", record
    assert not record["reset"].get("setup_failures")
    assert record["reward"] == 0.0


async def test_unsandboxed_desktops_have_a_session_bus_too():
    server = RunningServer(640, 480, extra_args=("--no-sandbox",))
    try:
        runtime = (await sh(server, "echo $XDG_RUNTIME_DIR")).strip()
        assert runtime.startswith(server.state)
        assert await sh(server, "echo $DBUS_SESSION_BUS_ADDRESS") == f"unix:path={runtime}/bus\n"
        await sh(server, f"gsettings set {LOCK} true")
        assert await sh(server, f"gsettings get {LOCK}") == "true\n"
        client = server.client()
        try:
            await client.reset()
        finally:
            await client.aclose()
        assert await sh(server, f"gsettings get {LOCK}") == "false\n"
    finally:
        server.stop()


async def test_a_revert_starts_a_bus_in_the_new_sandbox(server):
    await sh(server, f"gsettings set {LOCK} true && echo password | sudo -S touch /etc/legato-x")
    client = server.client()
    try:
        result = await client.reset()
        health = await client.health()
    finally:
        await client.aclose()
    assert result["kind"] == "revert" and "etc/legato-x" in result["reverted"]
    assert health["session_bus"]["running"]
    assert await sh(server, f"gsettings get {LOCK}") == "false\n"
    await sh(server, f"gsettings set {LOCK} true")
    assert await sh(server, f"gsettings get {LOCK}") == "true\n"
