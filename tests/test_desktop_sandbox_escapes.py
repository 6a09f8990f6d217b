"""A policy attacking its sandbox (issue 30, items 2, 3, 4 and 6): what it can do is only what
its actions and ``sudo`` inside can, through the desktop's own routes. Real servers on real
Xvfb, real namespaces; each attack succeeded on the code before the fix."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from legato_pipelines import DesktopConfig
from legato_pipelines.desktops.network import HOST_WARNING, resolve_network
from legato_pipelines.desktops.server.desktop import open_local_desktops
from legato_pipelines.tasks import load_tasks
from tests.desktop_local_support import LOCAL_SUITE, RunningServer, needs_xvfb

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
]
CAP_SYS_ADMIN = 1 << 21


@pytest.fixture(scope="module")
def server():
    # started as by `nohup legato ... &`: SIGHUP, SIGINT and SIGQUIT ignored
    ignored = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    running = RunningServer(640, 480, ignored_signals=ignored)
    yield running
    running.stop()


async def sh(server: RunningServer, command: str, timeout: float = 60) -> dict:
    client = server.client()
    try:
        return await client.execute(command, shell=True, timeout=timeout)
    finally:
        await client.aclose()


def sudo(command: str) -> str:
    """``command`` run by root inside the sandbox (``sudo -S sh -c``), stderr kept."""
    return f"echo password | sudo -S sh -c {shlex.quote(command)} 2>&1"


PRELOAD_C = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void probe(void) {
    char line[256], caps[512] = "";
    FILE *status = fopen("/proc/self/status", "r"), *log;
    if (!status) return;
    while (fgets(line, sizeof line, status))
        if (!strncmp(line, "CapEff:", 7) || !strncmp(line, "CapBnd:", 7)) {
            line[strcspn(line, "\n")] = ' ';
            strncat(caps, line, sizeof caps - strlen(caps) - 1);
        }
    fclose(status);
    log = fopen("/tmp/legato-preload.log", "a");
    if (!log) return;
    fprintf(log, "uid=%d %s\n", (int)getuid(), caps);
    fclose(log);
}
"""


#: A ``setpriv`` planted first on the task's PATH: logs its own capabilities, then runs the real one.
SETPRIV_WRAPPER = """#!/bin/sh
echo "uid=$(id -u) $(grep -E '^Cap(Eff|Bnd):' /proc/$$/status | tr '\\n\\t' '  ')" >> /tmp/legato-preload.log
exec /usr/bin/setpriv "$@"
"""


async def test_what_root_inside_plants_runs_in_no_entered_process_with_more_than_its_bounded_set(
    server,
):
    """Root inside plants a ``setpriv`` first on the PATH and, where gcc is installed,
    /etc/ld.so.preload (a library compiled here that logs the capabilities of every process
    loading it): the next processes entered into the sandbox, and sudo's root, run them only
    with the bounding set dropped; none holds CAP_SYS_ADMIN. (Before the fix the server's
    ``nsenter`` ran the sandbox's ``setpriv`` as uid 0 with every capability.)"""
    client = server.client()
    try:
        await client.reset(full=False)
        plant = sudo(
            f"printf %s {shlex.quote(SETPRIV_WRAPPER)} > /usr/local/sbin/setpriv &&"
            " chmod 755 /usr/local/sbin/setpriv"
        )
        if shutil.which("gcc"):
            plant += (
                f" && printf %s {shlex.quote(PRELOAD_C)} > /tmp/p.c"
                " && gcc -shared -fPIC -o /tmp/p.so /tmp/p.c && "
                + sudo(
                    "install -m 0755 /tmp/p.so /usr/local/lib/legato-probe.so && "
                    "echo /usr/local/lib/legato-probe.so > /etc/ld.so.preload"
                )
            )
        out = await client.execute(plant, shell=True, timeout=120)
        assert out["returncode"] == 0, out
        # the log is made now: what the plants logged so far ran as the user or sudo's root
        await client.execute("rm -f /tmp/legato-preload.log; true", shell=True)
        # the next entered processes: a plain command, and one that becomes root with sudo
        await client.execute(
            "touch /tmp/legato-preload.log; chmod 666 /tmp/legato-preload.log", shell=True
        )
        await client.execute(sudo("setpriv --dump >/dev/null"), shell=True)
        log = (await client.execute("cat /tmp/legato-preload.log", shell=True))["output"]
        rows = [line.split() for line in log.splitlines() if line.startswith("uid=")]
        assert rows, log  # sudo's root ran the planted setpriv (and every process the library)
        for row in rows:
            fields = dict(zip(row[1::2], row[2::2], strict=False))
            effective, bounding = int(fields["CapEff:"], 16), int(fields["CapBnd:"], 16)
            assert not bounding & CAP_SYS_ADMIN and not effective & CAP_SYS_ADMIN, log
            assert effective & ~bounding == 0, log
        assert any(row[0] == "uid=0" for row in rows)  # sudo's root: bounded all the same
        reset = await client.reset(full=False)
        assert reset["kind"] == "revert", reset
        assert "usr/local" in reset["reverted"], reset
    finally:
        await client.aclose()


async def test_an_entered_process_gets_the_ordinary_signal_dispositions(server):
    """The host's Python that enters the sandbox ignores SIGPIPE and SIGXFSZ, as every Python
    does, and this module's server was started ignoring SIGHUP, SIGINT and SIGQUIT, as
    ``nohup legato collect &`` is: the command it runs must inherit none of that (``yes |
    head -1`` ends quietly; Ctrl+C in the desktop's terminal stops a command, as on the VM)."""
    out = await sh(server, "yes | head -1; grep SigIgn /proc/self/status")
    assert out["output"].split() == ["y", "SigIgn:", "0000000000000000"], out


async def test_masks_over_proc_are_read_only_so_the_hosts_dev_null_cannot_be_changed(server):
    """/proc/keys and /proc/timer_list are masked with /dev/null: root inside chmods the mask
    (to the mode it has: harmless had it gone through), and the host's /dev/null keeps its
    inode change time. (Before the fix the mask was a writable bind of the host's inode.)"""
    before = os.stat("/dev/null")
    for mask in ("/proc/keys", "/proc/timer_list"):
        out = await sh(server, sudo(f"chmod 0666 {mask} && touch {mask}"))
        assert out["returncode"] != 0 and "Read-only file system" in out["output"], out
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_ctime_ns, after.st_mtime_ns) == (
        before.st_mode,
        before.st_ctime_ns,
        before.st_mtime_ns,
    )
    out = await sh(server, "cat /proc/keys /proc/timer_list | wc -c")
    assert out["output"].strip() == "0"  # still masked


SQUAT = """
import socket, sys, time
taken = []
for number in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind("\\0/tmp/.X11-unix/X" + number)
    except OSError as exc:
        print("refused", number, exc.strerror, flush=True)
        continue
    s.listen(8)
    s.settimeout(0.2)
    taken.append((number, s))
    print("bound", number, flush=True)
deadline = time.monotonic() + 20
while taken and time.monotonic() < deadline:
    for number, s in taken:
        try:
            conn, _ = s.accept()
        except OSError:
            continue
        print("caught a client of", number, flush=True)
        conn.close()
"""


def _x_client(display: str) -> subprocess.CompletedProcess:
    """A real libxcb client (xdpyinfo) on ``display``, from the host."""
    return subprocess.run(
        ["xdpyinfo", "-display", display], capture_output=True, text=True, timeout=20
    )


async def test_a_host_network_sandbox_cannot_take_another_displays_abstract_socket(server):
    """From a network=host sandbox, root inside binds the abstract socket name of another
    desktop's display (and of the next free numbers) and listens: the other desktop's new X
    clients (the host's xdpyinfo, through libxcb which tries the abstract name first) still
    reach their own Xvfb, and a desktop started afterwards takes a display whose name it holds."""
    victim = (await server.client().health())["display"]
    attacker = RunningServer(320, 240, extra_args=("--network", "host"))
    late = None
    try:
        own = int((await attacker.client().health())["display"][1:])
        # the victim's, and the next two numbers a new desktop may take (squatted only for
        # the seconds the test needs: an older server starting meanwhile would lose its clients)
        numbers = [victim[1:], *(str(n) for n in range(own + 1, own + 3))]
        script = shlex.quote(SQUAT)
        args = " ".join(numbers)
        start = sudo(f"python3 -c {script} {args} > /tmp/squat.log 2>&1 &") + "; sleep 1"
        assert (await sh(attacker, start))["returncode"] == 0
        done = _x_client(victim)
        assert done.returncode == 0 and "640x480 pixels" in done.stdout, done.stderr
        late = RunningServer(320, 240)
        late_display = (await late.client().health())["display"]
        done = _x_client(late_display)
        assert done.returncode == 0 and "320x240 pixels" in done.stdout, done.stderr
        # the attacker's own apps (host network) still reach their display through the file
        own_x = await sh(attacker, "xdpyinfo | grep dimensions")
        assert "320x240 pixels" in own_x["output"], own_x
        log = (await sh(attacker, "cat /tmp/squat.log"))["output"]
        for display in (victim, late_display):
            assert f"caught a client of {display[1:]}" not in log, log
        assert f"refused {victim[1:]}" in log, log
        assert f"bound {late_display[1:]}" not in log, (late_display, log)
    finally:
        if late is not None:
            late.stop()
        attacker.stop()


def _listener(family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family)
    sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
    sock.listen(8)
    return sock


#: Tries the host's loopback from inside: the sandbox's 127.0.0.1, and its IPv4 and IPv6
#: default gateways (pasta maps connections to the gateway onto the host's 127.0.0.1 / ::1
#: unless told not to: a red team reached Dagster that way). Prints ``reached WHERE`` per hit.
PROBE_PY = r"""
import socket, sys
port4, port6 = int(sys.argv[1]), int(sys.argv[2])
targets = [("127.0.0.1", port4, socket.AF_INET)]
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000" and f[2] != "00000000":
        targets.append((socket.inet_ntoa(bytes.fromhex(f[2])[::-1]), port4, socket.AF_INET))
for line in open("/proc/net/ipv6_route").read().splitlines():
    f = line.split()
    if f[0] == "0" * 32 and f[1] == "00" and f[4] != "0" * 32:
        gw = ":".join(f[4][i:i + 4] for i in range(0, 32, 4))
        targets.append((gw, port6, socket.AF_INET6))
for host, port, family in targets:
    try:
        socket.create_connection((host, port), 3).close()
        print("reached", host)
    except OSError as exc:
        print("refused", host, exc.__class__.__name__)
"""


def _probe(port: int, port6: int = 9) -> str:
    return f"python3 -c {shlex.quote(PROBE_PY)} {port} {port6} 2>&1"


def _tasks_file(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(entries))
    return path


@pytest.mark.skipif(shutil.which("pasta") is None, reason="network own needs pasta (passt)")
async def test_the_default_network_reaches_no_host_loopback_service(tmp_path):
    """A batch's desktops on the default network (auto): none for tasks needing no network,
    own (pasta) for a batch with a task whose grader reaches Chrome's port; neither reaches a
    listener on the host's 127.0.0.1. network=host reaches it, and is recorded with a
    warning. (Before the fix the default was the host's network.)"""
    terminal = [t for t in json.loads((LOCAL_SUITE / "tasks.json").read_text())][:1]
    chrome = {
        "task_id": "tabs",
        "config": {
            "id": "tabs",
            "instruction": "Look at the tab.",
            "config": [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": []}}],
            "evaluator": {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"}},
        },
    }
    plain = load_tasks(_tasks_file(tmp_path, terminal))
    needing = load_tasks(_tasks_file(tmp_path, [*terminal, chrome]))
    listener, listener6 = _listener(), _listener(socket.AF_INET6)
    port, port6 = listener.getsockname()[1], listener6.getsockname()[1]
    try:
        for tasks, expected in ((plain, "none"), (needing, "own"), (plain, "host")):
            options = {"network": "host"} if expected == "host" else {}
            config = DesktopConfig(
                backend="local", screen_width=320, screen_height=240, options=options
            )
            config, record = resolve_network(config, tasks.tasks)
            assert record["network"] == expected
            assert (record.get("network_warning") == HOST_WARNING) == (expected == "host")
            (desktop,) = await open_local_desktops(config, 1)
            try:
                health = await desktop.client.health()
                assert health["sandbox"]["network"] == expected
                out = await desktop.client.execute(_probe(port, port6), shell=True, timeout=30)
                assert ("reached" in out["output"]) == (expected == "host"), (expected, out)
                if expected == "own":  # it has a gateway: the mapping onto the host was tried
                    assert out["output"].count("refused") >= 2, out
            finally:
                await desktop.close()
    finally:
        listener.close()
        listener6.close()
    # a desktop opened without its batch's tasks gets no network either
    (desktop,) = await open_local_desktops(
        DesktopConfig(backend="local", screen_width=320, screen_height=240), 1
    )
    try:
        assert (await desktop.client.health())["sandbox"]["network"] == "none"
    finally:
        await desktop.close()


async def test_a_batch_records_its_network_and_warns_on_the_hosts(tmp_path, caplog):
    """collect decides the default network per batch and records it in run.json's knobs; a
    batch on network=host records the warning it logs."""
    from legato_pipelines import PolicyConfig
    from legato_pipelines.policy.scripted import ScriptedPolicyServer
    from legato_pipelines.rollout.engine import collect_async

    tasks = load_tasks(LOCAL_SUITE / "tasks.json")
    one = type(tasks)(tasks=tasks.tasks[:1], task_set="one")
    with ScriptedPolicyServer(flavor="vllm") as server:
        policy = PolicyConfig(base_url=server.url, model=server.model)
        for network in ("auto", "host"):
            options = {"grader": "own", "network": network}
            desktop = DesktopConfig(
                backend="local", screen_width=320, screen_height=240, options=options
            )
            out = tmp_path / network
            with caplog.at_level("WARNING"):
                await collect_async(
                    one, policy, out, desktops=1, desktop=desktop, max_steps=1, group=1
                )
            knobs = json.loads((out / "run.json").read_text())["knobs"]
            if network == "auto":  # a terminal task needs no network
                assert knobs["network"] == "none" and "network_warning" not in knobs
                assert HOST_WARNING not in caplog.text
            else:
                assert knobs["network"] == "host" and knobs["network_warning"] == HOST_WARNING
                assert HOST_WARNING in caplog.text


#: ``add_key``/``keyctl(KEYCTL_SEARCH)`` on the caller's user keyring, through libc's syscall():
#: prints the key's serial, or the negated errno (-126: ENOKEY).
KEYRING_PY = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
op, name = sys.argv[1], sys.argv[2].encode()
if op == "add":
    r = libc.syscall(248, b"user", name, b"x", 1, -4)
else:
    r = libc.syscall(250, 10, -4, b"user", name, 0)
print(r if r >= 0 else -ctypes.get_errno())
"""


def host_keyring(op: str, name: str, uid: int) -> int:
    """``KEYRING_PY`` on the host as ``uid`` (its user keyring in the host's user namespace)."""
    argv = ["python3", "-c", KEYRING_PY, op, name]
    if uid:
        argv = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", *argv]
    return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


async def test_kernel_keyrings_are_separate_per_desktop_and_from_the_host(server):
    """docs/sandbox.md §4 once said the identity uid map shares the user keyrings of a uid
    between the host and every desktop. Measured: the kernel keys a user keyring by user
    namespace too, so neither the sandbox's user nor its root finds the host's keys of the same
    uid, and the host finds none of the sandbox's."""
    ENOKEY = -126
    assert host_keyring("add", "legato-host-1000", 1000) > 0
    assert host_keyring("add", "legato-host-root", 0) > 0
    await sh(server, f"cat > /tmp/keyring.py << 'EOF'\n{KEYRING_PY}EOF")
    inside = await sh(
        server,
        "python3 /tmp/keyring.py search legato-host-1000; python3 /tmp/keyring.py add in-1000; "
        + sudo(
            "python3 /tmp/keyring.py search legato-host-root; python3 /tmp/keyring.py add in-root"
        ),
    )
    lines = inside["output"].split()
    assert int(lines[0]) == ENOKEY and int(lines[1]) > 0, inside
    assert int(lines[-2]) == ENOKEY and int(lines[-1]) > 0, inside
    assert host_keyring("search", "in-1000", 1000) == ENOKEY
    assert host_keyring("search", "in-root", 0) == ENOKEY


def _server_rss_mib(server: RunningServer) -> float:
    """The desktop server process's peak resident memory (``VmHWM``), MiB."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_a_huge_file_or_endless_output_is_cut_not_held_in_the_servers_memory(server):
    """A red team made a 1 GiB sparse file in HOME (no disk used, so no disk cap) and had the
    grader fetch it through ``/file``: the server read it whole into its memory (59 MiB ->
    3 GiB), outside the sandbox's memory cap; endless ``/execute`` output likewise. Now both
    stop at ``procs.MAX_OUTPUT_BYTES`` and answer 413, and the desktop goes on."""
    import httpx

    from legato_pipelines.desktops.server.procs import MAX_OUTPUT_BYTES

    size = MAX_OUTPUT_BYTES + 64 * 1024 * 1024
    made = await sh(server, f"truncate -s {size} ~/Desktop/result.xlsx && echo made")
    assert "made" in made["output"], made
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as http:
        got = await http.post("/file", data={"file_path": "/home/user/Desktop/result.xlsx"})
        assert got.status_code == 413, (got.status_code, got.text[:200])
        assert f"larger than {MAX_OUTPUT_BYTES} bytes" in got.text
        endless = await http.post("/execute", json={"command": "yes", "shell": True})
        assert endless.status_code == 413, (endless.status_code, endless.text[:200])
    # bounded: each request holds at most the cap (two requests on two of the server's worker
    # threads may each keep a malloc arena of it); before, the 320 MiB file alone cost ~1 GiB
    assert _server_rss_mib(server) < 2.5 * MAX_OUTPUT_BYTES / 2**20, _server_rss_mib(server)
    still = await sh(server, "rm ~/Desktop/result.xlsx; echo alive")
    assert "alive" in still["output"]
