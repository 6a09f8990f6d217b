"""Sandboxed local desktops: OSWorld's account and paths, root inside only, the host out of
sight, revert by dropping the overlay, setup failures as facts. Real servers on real Xvfb."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, load_tasks
from legato_pipelines.desktops.server import session as session_mod
from legato_pipelines.desktops.server.desktop import open_local_desktops
from legato_pipelines.errors import DesktopError
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.rollout.profile import profile
from tests.desktop_local_support import RunningServer, needs_xvfb, still_alive
from tests.desktop_sandbox_support import osworld_task

pytestmark = [needs_xvfb, pytest.mark.desktop]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)")
SANDBOX_PY = Path(__file__).parents[1] / "legato_pipelines/desktops/server/sandbox.py"


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
    default, _ = servers  # the server's default network is none
    port = int(default.url.rsplit(":", 1)[1])
    probe = (
        'python3 -c "import socket; '
        f"socket.create_connection(('127.0.0.1', {port}), 2); print('reached')\""
    )
    host_net = RunningServer(320, 240, extra_args=("--network", "host"))
    try:  # asked for explicitly, the host's network reaches the host's loopback
        assert "reached" in (await sh(host_net, probe))["output"]
        assert (await host_net.client().health())["sandbox"]["network"] == "host"
    finally:
        host_net.stop()
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
            "legato_pipelines.desktops.server.main",
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
            # a program the host lacks is refused by the preflight; one that exits 127 is not
            {"type": "launch", "parameters": {"command": ["sh", "-c", "no-such-app-xyz"]}},
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


def sudo(command: str) -> str:
    """``command`` run by root inside the sandbox (``sudo -S sh -c``), stderr kept."""
    return f"echo password | sudo -S sh -c {shlex.quote(command)} 2>&1"


@needs_root
async def test_root_inside_cannot_write_host_sysctls_nor_remount_proc_and_sys(servers):
    """Root inside is host uid 0 for DAC (identity uid map): /proc/sys and friends are
    read-only mounts, and no process inside holds CAP_SYS_ADMIN to remount them."""
    server, _ = servers
    host_core = Path("/proc/sys/kernel/core_pattern").read_text()
    # the same value written back: harmless even where the write went through
    out = await sh(
        server, sudo("cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern")
    )
    assert out["returncode"] != 0 and "Read-only" in out["output"], out
    for attempt in (
        "mount -o remount,rw /sys",
        "mount -o remount,bind,rw /sys",
        "mount -o remount,bind,rw /sys/fs/cgroup",
        "mount -o remount,rw /proc/sys",
        "mount -o remount,bind,rw /proc/sys",
        "mount -t tmpfs legato-probe /mnt",
        "umount -l /proc/sys",
    ):
        assert (await sh(server, sudo(attempt)))["returncode"] != 0, attempt
    out = await sh(server, "findmnt -n -o OPTIONS /proc/sys; findmnt -n -o OPTIONS /sys")
    assert [line.split(",")[0] for line in out["output"].split()] == ["ro", "ro"]
    assert Path("/proc/sys/kernel/core_pattern").read_text() == host_core
    # not even root inside holds CAP_SYS_ADMIN (bit 21) or CAP_SETFCAP (31), nor the init
    out = await sh(server, sudo("grep CapBnd /proc/self/status /proc/1/status"))
    masks = [int(line.split()[-1], 16) for line in out["output"].splitlines() if "CapBnd" in line]
    assert len(masks) == 2 and all(not mask & (1 << 21 | 1 << 31) for mask in masks), out
    # root inside cannot become root-with-all-capabilities in a user namespace of its own
    assert (await sh(server, sudo("unshare --user --map-root-user true")))["returncode"] != 0
    # ... while the user can (Chromium's sandbox is built that way)
    assert (await sh(server, "unshare --user --map-root-user true"))["returncode"] == 0
    # kernel internals are masked: /proc/keys and /proc/timer_list read empty
    out = await sh(server, "cat /proc/keys /proc/timer_list 2>/dev/null | wc -c")
    assert out["output"].strip() == "0"
    marker = f"/etc/legato-sudo-{secrets.token_hex(4)}"
    out = await sh(server, sudo(f"touch {marker} && ls {marker}"))
    assert out["returncode"] == 0 and marker in out["output"], out
    assert not os.path.exists(marker)


@needs_root
async def test_no_cgroup_file_is_writable_by_root_inside(servers):
    server, _ = servers
    probe = f"legato-probe-{secrets.token_hex(4)}"
    script = (
        "n=0; for f in $(find /sys/fs/cgroup -maxdepth 3 -type f); do"
        ' test -w "$f" && n=$((n+1)); done; echo writable=$n;'
        f" for m in $(findmnt -R -n -r -o TARGET /sys/fs/cgroup); do mkdir $m/{probe} && echo made; done"
    )
    try:
        out = await sh(server, sudo(script))
        assert "writable=0" in out["output"] and "made" not in out["output"], out
    finally:
        for made in Path("/sys/fs/cgroup").glob(f"**/{probe}"):
            made.rmdir()


@needs_root
async def test_fast_reset_kills_task_processes_named_like_the_init(servers):
    server, _ = servers
    client = server.client()
    try:
        await client.reset(full=False)  # whatever the tests before left
        out = await client.execute(
            "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $!", shell=True
        )
        pid = out["output"].strip()
        probe = f"ps -o args= -p {pid}"
        assert (await client.execute(probe, shell=True))["output"].strip() == "sleep 1000"
        assert (await client.reset(full=False))["kind"] == "fast"
        assert (await client.execute(probe, shell=True))["output"].strip() == ""
        out = await client.execute("ps -e -o comm= | grep -c '^sleep$'", shell=True)
        assert out["output"].strip() == "1"  # the init's own
    finally:
        await client.aclose()


@needs_root
async def test_fast_reset_clears_runtime_dirs_and_reverts_other_leftovers(servers):
    """/run/user/1000, /dev/shm, /run (sudo's timestamps) are emptied by a fast reset; a file
    under /root or a System V semaphore left by the task makes the reset a revert."""
    server, _ = servers
    client = server.client()
    try:
        await client.reset(full=False)  # whatever the tests before left
        write = "touch /run/user/1000/x /dev/shm/x && mkdir /dev/shm/d && " + sudo("true")
        assert (await client.execute(write, shell=True))["returncode"] == 0
        assert (await client.reset(full=False))["kind"] == "fast"
        out = await client.execute("ls -A /run/user/1000 /dev/shm /dev/mqueue; ls /run", shell=True)
        # what stays: the new session bus's socket and its dbus-1/ (docs/local-desktop.md §10)
        bus = ["bus", "dbus-1"] if (await client.health())["session_bus"].get("running") else []
        expected = ["/dev/mqueue:", "/dev/shm:", "/run/user/1000:", *bus, "user"]
        assert out["output"].split() == expected, out
        assert (await client.execute("sudo -n true", shell=True))["returncode"] != 0
        for leftover, named in ((sudo("touch /root/x"), "root/x"), ("ipcmk -S 1", "ipc/sem")):
            assert (await client.execute(leftover, shell=True))["returncode"] == 0
            reset = await client.reset(full=False)
            assert reset["kind"] == "revert" and named in reset["reverted"], reset
        out = await client.execute("ls -A /root; ipcs -s | grep -c 0x", shell=True)
        assert out["output"].split() == ["0"]
    finally:
        await client.aclose()


@needs_root
async def test_host_uid_1000_cannot_read_what_the_sandbox_user_wrote(servers):
    """uid 1000 inside is the host's uid 1000: the host's must reach no HOME, /tmp or
    runtime dir of a sandbox, neither by path nor through /proc/PID/root."""
    server, _ = servers
    client = server.client()
    try:
        await client.execute(
            "for d in ~ /tmp /run/user/1000; do echo secret > $d/legato-secret; done;"
            " sleep 30 >/dev/null 2>&1 &",
            shell=True,
        )
        health = await client.health()
        state = Path(server.state)
        host_files = [
            Path(health["host_home"]) / "legato-secret",
            *(state / "sandbox").glob("layers-*/tmp/legato-secret"),
            *(state / "sandbox").glob("layers-*/run/legato-secret"),
        ]
        assert len(host_files) == 3
        assert all(path.read_text() == "secret\n" for path in host_files)
        init = health["sandbox"]["init_pid"]
        user_pids = [pid for pid in _pid_namespace_members(init) if _host_uid(pid) == 1000]
        assert user_pids  # the sleep
        via_proc = [f"/proc/{pid}/root/home/user/legato-secret" for pid in user_pids]
        for path in [*map(str, host_files), f"/proc/{init}/root/tmp/legato-secret", *via_proc]:
            done = subprocess.run(
                ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "cat", path],
                capture_output=True,
                text=True,
            )
            assert done.returncode != 0 and "secret" not in done.stdout, path
    finally:
        await client.reset(full=False)
        await client.aclose()


def _pid_namespace_members(init: int) -> list[str]:
    """Host pids of the processes in ``init``'s pid namespace."""
    ns = os.readlink(f"/proc/{init}/ns/pid")
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.readlink(f"/proc/{pid}/ns/pid") == ns:
                found.append(pid)
        except OSError:
            pass
    return found


def _host_uid(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@needs_root
async def test_an_unsandboxed_display_is_out_of_a_sandboxs_reach(servers):
    sandboxed, _ = servers
    host = RunningServer(640, 480, extra_args=("--no-sandbox",))
    try:
        other = (await host.client().health())["display"]
        own = (await sandboxed.client().health())["display"]
        assert (await sh(host, "xdpyinfo >/dev/null && echo ok"))["output"].strip() == "ok"
        probe = "xdpyinfo -display {} >/dev/null 2>&1 && echo reached"
        assert (await sh(sandboxed, probe.format(own)))["output"].strip() == "reached"
        assert (await sh(sandboxed, probe.format(other)))["output"].strip() == ""
    finally:
        host.stop()


@needs_root
def test_a_server_killed_with_sigkill_leaves_no_sandbox_process_nor_session_bus():
    """``kill -9`` of a desktop server (the OOM killer, a crashed host agent) takes its
    sandboxes along: each sandbox's init (tini) gets SIGKILL when its ``unshare`` dies
    (``tini -p SIGKILL``), and the kernel then ends everything in that pid namespace, the
    session bus included. (The parent-death signal ``unshare --kill-child`` sets did not
    survive the exec chain to tini: both inits, their sleeps, the bus and the bus's nsenter
    were left running, re-parented to init, one set per killed server.)"""
    from legato_pipelines.desktops.server.procs import descendants, process_table

    server = RunningServer(320, 240)
    try:
        deadline = time.monotonic() + 10
        while True:  # the running sandbox's and the spare's init (the spare starts after "ready")
            table = process_table()
            below = descendants(server.proc.pid, table)
            inits = [pid for pid in below if table[pid].comm == "tini"]
            if len(inits) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(inits) == 2, below
        assert any(table[pid].comm == "dbus-daemon" for pid in below)
        watched = {(pid, table[pid].comm) for pid in below}
        watched |= {
            (int(pid), table[int(pid)].comm)
            for init in inits
            for pid in _pid_namespace_members(init)
            if int(pid) in table
        }
        server.proc.kill()
        server.proc.wait()
        alive = still_alive(watched)
    finally:
        server.stop()  # its state directory (the process is gone already)
    assert alive == []


@needs_root
def test_a_closed_desktop_leaves_no_display_files_and_stale_locks_are_reused():
    server = RunningServer(320, 240)
    number = server.info["display"][1:]
    files = [Path(f"/tmp/.X{number}-lock"), Path(f"/tmp/.X11-unix/X{number}")]
    assert all(path.exists() for path in files)
    server.stop()
    assert not any(path.exists() for path in files)
    # a lock whose owner is dead is no obstacle: the number is claimed again
    dead = subprocess.Popen(["true"])
    dead.wait()
    free = next(n for n in range(7000, 8000) if not Path(f"/tmp/.X{n}-lock").exists())
    lock = Path(f"/tmp/.X{free}-lock")
    lock.write_text(f"{dead.pid:10d}\n")
    assert session_mod._free_display(free) == free
    xvfb = subprocess.Popen(["Xvfb", f":{free}", "-nolisten", "tcp", "-nolisten", "local"])
    try:
        deadline = time.monotonic() + 10
        while session_mod._lock_owner(free) != xvfb.pid and time.monotonic() < deadline:
            time.sleep(0.01)
        assert session_mod._lock_owner(free) == xvfb.pid
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    assert not lock.exists()
    lock.write_text(f"{os.getpid():10d}\n")  # a live owner: taken
    try:
        assert session_mod._free_display(free) > free
    finally:
        lock.unlink()


@needs_root
async def test_open_resolves_paths_inside_the_sandbox_not_on_the_host(servers):
    """An ``open`` of a symlink to a host-only file is a missing file (404 at once): the server
    checks paths as the user inside, never through /proc/PID/root on the host."""
    server, _ = servers
    secret = Path("/root") / f"legato-oracle-{secrets.token_hex(4)}.txt"
    secret.write_text("host only")
    client = server.client()
    try:
        assert (await client.execute(f"ln -s {secret} ~/link.txt", shell=True))["returncode"] == 0
        with pytest.raises(DesktopError) as err:
            await client.open_file("/home/user/link.txt", timeout=2)
        assert "File not found" in str(err.value)
    finally:
        secret.unlink()
        await client.reset(full=False)
        await client.aclose()


@needs_root
async def test_a_link_planted_in_tmp_is_never_followed_by_the_next_sandboxs_setup(servers):
    """Root inside replaces /tmp/.X11-unix by a link to a host directory and forces a revert
    while HOME takes long to restore: the next sandbox's setup (root, on the host) must not
    chmod that directory nor create anything in it (every sandbox has a /tmp of its own)."""
    server, _ = servers
    target = Path("/tmp") / f"legato-target-{secrets.token_hex(4)}"
    target.mkdir(mode=0o700)
    client = server.client()
    try:
        await client.reset(full=False)
        plant = "mkdir ~/many && cd ~/many && seq 30000 | xargs touch && " + sudo(
            f"mv /tmp/.X11-unix /tmp/xold; ln -s {target} /tmp/.X11-unix; touch /etc/forcerevert"
        )
        assert (await client.execute(plant, shell=True, timeout=120))["returncode"] == 0
        for _ in range(2):  # the revert, then the spare it started takes over
            await client.execute(sudo("touch /etc/forcerevert"), shell=True)
            assert (await client.reset(full=False))["kind"] == "revert"
        await client.reset(full=True)
        assert oct(target.stat().st_mode & 0o7777) == "0o700" and not any(target.iterdir())
        out = await client.execute(
            "stat -c %a /tmp/.X11-unix; xdpyinfo >/dev/null && echo ok", shell=True
        )
        assert out["output"].split() == ["1777", "ok"], out
    finally:
        await client.reset(full=False)
        await client.aclose()
        for child in target.iterdir():
            child.unlink()
        target.rmdir()


@needs_root
async def test_root_inside_cannot_chmod_or_chown_the_hosts_device_nodes_nor_x_socket(servers):
    """/dev/null, /dev/full... and the X socket are binds of host inodes: read-only mounts,
    so root inside (host uid 0 for permission checks) cannot change them on the host, while
    writing /dev/null and using the display still work."""
    server, _ = servers
    health = await server.client().health()
    x_socket = f"/tmp/.X11-unix/X{health['display'][1:]}"
    host = ["/dev/null", "/dev/full", "/dev/tty", x_socket]
    before = {path: os.stat(path) for path in host}
    try:
        for path in host:
            for attempt in (f"chmod 000 {path}", f"chown 1000 {path}"):
                out = await sh(server, sudo(attempt))
                assert out["returncode"] != 0 and "Read-only" in out["output"], (attempt, out)
        if Path("/usr/lib/chromium/chrome").exists():
            out = await sh(server, sudo("chmod 000 /usr/lib/chromium/chrome"))
            assert out["returncode"] != 0, out
        out = await sh(server, "echo x > /dev/null && xdpyinfo >/dev/null && echo ok")
        assert out["output"].strip() == "ok", out
    finally:
        for path, st in before.items():  # put the host back if the test failed
            os.chmod(path, st.st_mode & 0o7777)
            os.chown(path, st.st_uid, st.st_gid)
    after = {path: os.stat(path) for path in host}
    for path in host:
        assert (after[path].st_mode, after[path].st_uid) == (
            before[path].st_mode,
            before[path].st_uid,
        ), path


@needs_root
async def test_modes_owners_and_entries_changed_outside_home_survive_no_reset(servers):
    """A new entry in /home, a chmod of /usr, /, /etc, /tmp, /home, /dev/shm or
    /run/user/1000, a /run/user replaced by a link: all gone after the next reset."""
    server, _ = servers
    client = server.client()
    modes = "stat -c '%n %a %U' / /etc /usr /tmp /home /dev/shm /run/user /run/user/1000"
    try:
        await client.reset(full=False)
        clean = (await client.execute(modes, shell=True))["output"]
        assert "/tmp 1777 root" in clean and "/run/user/1000 700 user" in clean, clean
        for full in (False, True):
            assert (await client.execute(sudo("mkdir /home/evil"), shell=True))["returncode"] == 0
            await client.reset(full=full)
            assert (await client.execute("ls -A /home", shell=True))["output"].split() == ["user"]
        attacks = [sudo(f"chmod 0700 {d}") for d in ("/usr", "/", "/etc", "/tmp", "/home")]
        attacks += [sudo("chmod 0700 /dev/shm"), "chmod 000 /run/user/1000"]
        attacks += [sudo("chown 1000 /tmp"), sudo("mv /run/user /run/x; ln -s /tmp /run/user")]
        for attack in attacks:
            assert (await client.execute(attack, shell=True))["returncode"] == 0, attack
            await client.reset(full=False)
            out = await client.execute(modes, shell=True)
            assert out["output"] == clean, (attack, out)
            out = await client.execute("ls /run; ls -A /run/user/1000", shell=True)
            assert out["output"].split()[0] == "user" and "x" not in out["output"].split(), (
                attack,
                out,
            )
        out = await client.execute("xdpyinfo >/dev/null && echo ok", shell=True)
        assert out["output"].strip() == "ok"
    finally:
        await client.reset(full=False)
        await client.aclose()


@needs_root
async def test_home_replaced_by_a_link_is_restored_by_fast_and_full_reset(servers):
    server, _ = servers
    client = server.client()
    try:
        for full in (False, True):
            attack = sudo("cd /; rm -rf /home/user; ln -s /etc /home/user")
            assert (await client.execute(attack, shell=True))["returncode"] == 0
            await client.reset(full=full)
            out = await client.execute(
                "stat -c '%F %U' /home/user; ls ~/Desktop && pwd", shell=True
            )
            assert out["output"].split("\n")[:2] == ["directory user", "/home/user"], out
            assert Path("/etc/passwd").exists()
    finally:
        await client.aclose()


@needs_root
async def test_execute_timeout_holds_when_another_session_keeps_the_pipe_open(servers):
    """``(setsid sleep 25 &)`` keeps the command's stdout open after the command ended: the
    answer still comes at the timeout, with what was written so far."""
    server, _ = servers
    client = server.client()
    try:
        t0 = time.monotonic()
        out = await client.execute("(setsid sleep 25 &); echo started", shell=True, timeout=3)
        took = time.monotonic() - t0
        assert took < 8, took
        assert out["status"] == "error" and "timed out" in out["error"], out
        assert out["output"] == "started\n", out
    finally:
        await client.reset(full=False)
        await client.aclose()


@needs_root
async def test_the_sandboxs_tmpfs_mounts_are_size_limited(servers):
    server, _ = servers
    out = await sh(server, "df -k --output=size / /dev /dev/shm /run /root | tail -n +2")
    sizes = [int(n) for n in out["output"].split()]
    assert sizes == [16 * 1024, 16 * 1024, 1024**2, 1024**2, 1024**2], out
