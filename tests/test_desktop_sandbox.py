"""Sandboxed local desktops: OSWorld's account and paths, root inside only, the host out of
sight, revert by dropping the overlay, setup failures as facts. Real servers on real Xvfb."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, load_tasks
from legato_pipelines.desktops.local.backend import open_local_desktops
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.rollout.profile import profile
from tests.desktop_local_support import RunningServer, needs_xvfb
from tests.desktop_sandbox_support import osworld_task

pytestmark = [needs_xvfb, pytest.mark.desktop]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)")
SANDBOX_PY = Path(__file__).parents[1] / "legato_pipelines/desktops/local/sandbox.py"


@pytest.fixture(scope="module")
def servers():
    first, second = RunningServer(640, 480), RunningServer(640, 480)
    yield first, second
    first.stop()
    second.stop()


async def sh(server: RunningServer, command: str) -> dict:
    client = server.client()
    try:
        return await client.execute(command, shell=True)
    finally:
        await client.aclose()


@needs_root
async def test_osworld_account_home_and_sudo_root_inside_only(servers):
    server, _ = servers
    out = await sh(server, 'id -un; echo "$HOME"; pwd; id -u')
    assert out["output"].split() == ["user", "/home/user", "/home/user", "1000"]
    marker = f"/etc/legato-sudo-{secrets.token_hex(4)}"
    out = await sh(server, f"echo password | sudo -S touch {marker} && ls {marker}")
    assert out["returncode"] == 0, out
    assert out["output"].strip() == marker
    assert not os.path.exists(marker)  # the host's /etc is untouched
    assert (await sh(server, "echo wrong | sudo -S true"))["returncode"] != 0
    assert (await sh(server, "echo password | sudo -S id -u"))["output"].strip() == "0"


@needs_root
async def test_host_files_processes_and_project_are_invisible(servers, tmp_path):
    server, _ = servers
    secret = Path("/root") / f"legato-secret-{secrets.token_hex(4)}"
    secret.write_text("host only")
    secret.chmod(0o600)
    try:
        out = await sh(server, f"echo password | sudo -S cat {secret}; ls /root | wc -l")
        assert "host only" not in out["output"]
        assert out["output"].split()[-1] == "0"
    finally:
        secret.unlink()
    repo = Path(__file__).parents[1]
    for path in (str(repo), str(tmp_path), server.state):
        out = await sh(server, f"ls -d {path}")
        assert out["returncode"] != 0, f"{path} is visible inside the sandbox"
    out = await sh(server, "ps -e -o pid=,comm=")
    rows = [line.split() for line in out["output"].splitlines()]
    assert rows[0] == ["1", "tini"]
    comms = {comm for _, comm in rows}
    assert not comms & {"pytest", "python3", "python", "Xvfb", "openbox"}, comms
    assert len(rows) < 10
    # the policy key of the collector is nowhere inside
    out = await sh(server, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c LEGATO_")
    assert out["output"].strip() == "0"


@needs_root
async def test_desktops_see_neither_each_others_home_nor_display(servers):
    first, second = servers
    name = f"mine-{secrets.token_hex(4)}.txt"
    assert (await sh(first, f"echo first > ~/{name}"))["returncode"] == 0
    out = await sh(second, f"ls /home; cat /home/user/{name}")
    assert out["output"].split() == ["user"] and out["returncode"] != 0
    health = await first.client().health()
    assert (await sh(second, f"ls {health['host_home']}"))["returncode"] != 0
    other = health["display"]
    own = (await second.client().health())["display"]
    assert (await sh(second, f"DISPLAY={own} xdpyinfo >/dev/null"))["returncode"] == 0
    assert (await sh(second, f"DISPLAY={other} xdpyinfo >/dev/null 2>&1"))["returncode"] != 0


@needs_root
async def test_writes_outside_home_are_gone_after_the_next_reset(servers):
    server, _ = servers
    client = server.client()
    try:
        script = (
            "echo password | sudo -S sh -c 'echo x > /etc/legato-x; mkdir -p /usr/local/legato'"
        )
        assert (await client.execute(script, shell=True))["returncode"] == 0
        reset = await client.reset(full=False)
        assert reset["kind"] == "revert"
        assert "etc/legato-x" in reset["reverted"]
        out = await client.execute("ls /etc/legato-x /usr/local/legato", shell=True)
        assert out["returncode"] != 0
        assert (await client.reset(full=False))["kind"] == "fast"  # nothing written: fast
        out = await client.execute("id -un; xdpyinfo >/dev/null && echo display", shell=True)
        assert out["output"].split() == ["user", "display"]
    finally:
        await client.aclose()


@needs_root
async def test_network_none_has_only_a_loopback_and_still_its_display(servers):
    host_net, _ = servers
    port = int(host_net.url.rsplit(":", 1)[1])
    probe = (
        'python3 -c "import socket; '
        f"socket.create_connection(('127.0.0.1', {port}), 2); print('reached')\""
    )
    assert "reached" in (await sh(host_net, probe))["output"]
    isolated = RunningServer(640, 480, extra_args=("--network", "none"))
    try:
        out = await sh(isolated, "ip -o link | cut -d: -f2; " + probe)
        assert out["output"].split()[:1] == ["lo"] and "reached" not in out["output"]
        assert (await sh(isolated, "xdpyinfo >/dev/null && echo ok"))["output"].strip() == "ok"
        assert (await isolated.client().health())["sandbox"]["network"] == "none"
    finally:
        isolated.stop()


def test_without_root_the_sandbox_says_what_is_missing():
    """A non-root server refuses at once naming the fix (the module is stdlib only: its source
    runs as ``nobody`` from stdin)."""
    source = SANDBOX_PY.read_text() + "\nr = check_support(); print(r.ok); print(r.problem)\n"
    argv = ["/usr/bin/python3", "-"]
    if os.geteuid() == 0:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    done = subprocess.run(argv, input=source, capture_output=True, text=True, timeout=30, cwd="/")
    assert done.returncode == 0, done.stderr
    ok, problem = done.stdout.split("\n", 1)
    assert ok == "False"
    assert "root" in problem and "sandbox=false" in problem


async def test_sandbox_false_is_explicit_and_runs_on_the_host():
    server = RunningServer(640, 480, extra_args=("--no-sandbox",))
    try:
        health = await server.client().health()
        assert health["sandbox"] is None
        out = await sh(server, 'echo "$HOME"')
        assert out["output"].strip() == health["home"] != "/home/user"
    finally:
        server.stop()
    bad = subprocess.run(
        [
            "python3",
            "-m",
            "legato_pipelines.desktops.local.server",
            "--no-sandbox",
            "--network",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, LEGATO_DESKTOP_TOKEN="t"),
    )
    assert bad.returncode != 0 and "needs the sandbox" in bad.stderr


@needs_root
async def test_osworld_e0df059f_setup_root_owned_folder_via_sudo_succeeds():
    """OSWorld's os task e0df059f: ``sudo -S mkdir`` in setup, then pyautogui; graded by
    exact_match over a shell command: 0 doing nothing, 1 after the rename."""
    task = osworld_task("e0df059f")
    config = DesktopConfig(backend="local", screen_width=1280, screen_height=720)
    (desktop,) = await open_local_desktops(config, 1)
    try:
        await desktop.reset(task)
        assert desktop.setup_failures == []
        out = await desktop.client.execute("stat -c %U ~/Desktop/todo_list_Jan_1", shell=True)
        assert out["output"].strip() == "root"
        assert (await desktop.evaluate(task)).reward == 0.0
        mv = "mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"
        assert (await desktop.client.execute(mv, shell=True))["returncode"] == 0
        assert (await desktop.evaluate(task)).reward == 1.0
    finally:
        await desktop.close()


@needs_root
async def test_setup_command_exiting_127_is_in_the_record_and_the_profile(tmp_path):
    config = {
        "id": "setup-127",
        "instruction": "Terminate.",
        "config": [
            {"type": "execute", "parameters": {"command": "no-such-cmd-xyz", "shell": True}},
            {"type": "launch", "parameters": {"command": ["no-such-app-xyz"]}},
        ],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo ok", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "ok\n"}},
        },
    }
    tasks = [{"task_id": "setup-127", "domain": "os", "config": config}]
    tasks_path = tmp_path / "tasks.json"
    tasks_path.write_text(json.dumps(tasks))
    out = tmp_path / "run"
    with ScriptedPolicyServer(flavor="vllm") as server:
        await collect_async(
            load_tasks(tasks_path),
            PolicyConfig(base_url=server.url, model=server.model),
            out,
            desktops=1,
            desktop=DesktopConfig(backend="local", screen_width=640, screen_height=480),
            group=1,
            max_steps=1,
        )
    (record,) = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    failures = record["reset"]["setup_failures"]
    assert [(f["step"], f["type"], f["exit_status"]) for f in failures] == [
        (0, "execute", 127),
        (1, "launch", 127),
    ]
    assert "no-such-cmd-xyz" in failures[0]["error"]
    summary = profile(out)
    assert summary["setup_failures"]["attempts"] == 1
    assert summary["setup_failures"]["by_step"] == {
        "setup-127 step 0 (execute)": 1,
        "setup-127 step 1 (launch)": 1,
    }
