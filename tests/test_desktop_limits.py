"""Resource caps of sandboxed local desktops (limits.py): a fork bomb, a memory hog and a disk
fill, started by a policy typing into a terminal, each end as a recorded desktop failure of
type ``resource_limit`` naming its cap; the desktop is reverted and the next attempt on it
works; the host's process count stays bounded. Real collects on real sandboxed desktops, with
small caps so they run quickly. The v2 cgroup path runs against a fake cgroup tree only (this
machine has cgroup v1): it checks file names and values, not a kernel."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import orjson
import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, read_records
from legato_pipelines.desktops.server.limits import (
    Caps,
    DesktopLimits,
    cgroup_version,
    make_cgroup,
    parse_caps,
)
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.rollout.profile import profile
from tests.desktop_local_support import RunningServer, needs_xvfb

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes and cgroups need root")
SMALL = {"pids": 128, "memory": "256m", "disk": "96m"}

#: Commands a policy types into the task's xterm. The "fork bomb" is bounded (2000 sleeping
#: processes, far above the cap) so that a broken cap cannot take the shared test host down.
ATTACKS = {
    "pids": "for i in $(seq 2000); do sleep 300 & done",
    "memory": "head -c 2G /dev/zero | tail",
    "disk": "dd if=/dev/zero of=$HOME/fill bs=1M",
}


def qwen(step: dict) -> str:
    call = orjson.dumps({"name": "computer_use", "arguments": step}).decode()
    return f"Action: {step['action']}.\n<tool_call>\n{call}\n</tool_call>"


def task(name: str) -> dict:
    """A task whose setup opens an xterm; the check is ``echo ok`` inside the desktop."""
    return {
        "id": name,
        "instruction": f"Task {name}: run the command in the terminal.",
        "config": [{"type": "launch", "parameters": {"command": ["xterm"]}}],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo ok", "shell": True},
            "expected": {"type": "rule", "rules": {"expected": "ok\n"}},
        },
    }


def host_process_count() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


class PeakProcesses:
    """The host's largest process count while the block runs (sampled every 20 ms)."""

    def __enter__(self):
        self.peak, self._stop = host_process_count(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, host_process_count())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@needs_xvfb
@needs_root
@pytest.mark.desktop
async def test_fork_bomb_memory_hog_and_disk_fill_end_as_env_failures_of_their_cap(tmp_path):
    names = [*ATTACKS, "after"]
    tasks = [{"task_id": n, "domain": "os", "config": task(n)} for n in names]
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    script = {"tasks": {}}
    for name in names:
        command = ATTACKS.get(name, "true")
        script["tasks"][task(name)["instruction"]] = [
            qwen({"action": "type", "text": command + "\n"}),
            qwen({"action": "wait", "time": 4}),
            qwen({"action": "terminate", "status": "success"}),
        ]
    before = host_process_count()
    with PeakProcesses() as peak, ScriptedPolicyServer(flavor="vllm", script=script) as policy:
        summary = await collect_async(
            tmp_path / "tasks.json",
            PolicyConfig(base_url=policy.url, model=policy.model),
            tmp_path / "run",
            desktops=1,
            desktop=DesktopConfig(
                backend="local",
                screen_width=640,
                screen_height=480,
                options={"limits": SMALL, "prebuild": [], "grader": "own"},
            ),
            group=1,
            max_steps=3,
            env_retries=0,
            max_inflight=1,
        )
    records = {r["task_id"]: r for r in read_records(tmp_path / "run")}
    for cap in ATTACKS:
        record = records[cap]
        assert record["status"] == "error", record
        assert record["error"]["kind"] == "env"
        assert record["error"]["type"] == "resource_limit"
        assert record["error"]["message"].split("resource cap hit: ")[1].startswith(f"{cap}:")
    # the desktop was reverted: the next attempt on it runs and is graded
    assert records["after"]["status"] == "ok" and records["after"]["reward"] == 1.0
    assert summary["env_failure_kinds"] == {"resource_limit": 3}
    assert profile(tmp_path / "run")["env_failure_kinds"] == {"resource_limit": 3}
    # the host never saw the 2000 processes: at most the cap more (+ the desktop's own)
    assert peak.peak - before < 128 + 150, (before, peak.peak)


@needs_xvfb
@needs_root
@pytest.mark.desktop
async def test_caps_are_set_on_the_sandbox_and_read_only_inside(tmp_path):
    server = RunningServer(320, 240, extra_args=("--limits", json.dumps(SMALL)))
    client = server.client()
    try:
        limits = (await client.health())["limits"]
        assert limits["caps"]["pids"] == 128 and limits["hit"] is None
        out = await client.execute("cat /proc/self/cgroup; df -B1 --output=size ~ /tmp", shell=True)
        assert out["returncode"] == 0, out
        pids_path = next(p for p in limits["paths"] if p.startswith("/sys/fs/cgroup/pids/"))
        assert f"pids:{pids_path.removeprefix('/sys/fs/cgroup/pids')}" in out["output"]
        sizes = [int(w) for w in out["output"].split() if w.isdigit()]
        assert sizes and all(s < 96 << 20 for s in sizes[-2:])  # HOME and /tmp: the disk cap
        assert Path(pids_path, "pids.max").read_text().strip() == "128"
        cpu_path = next(p for p in limits["paths"] if p.startswith("/sys/fs/cgroup/cpu/"))
        quota = int(max(1.0, (os.cpu_count() or 2) / 2) * 100_000)  # half the CPUs, at least 1
        assert Path(cpu_path, "cpu.cfs_quota_us").read_text().strip() == str(quota)
        assert Path(cpu_path, "cpu.shares").read_text().strip() == "1024"
        sudo = f"echo password | sudo -S sh -c 'echo max > {pids_path}/pids.max' 2>&1"
        out = await client.execute(sudo, shell=True)
        assert "Read-only file system" in out["output"], out
        assert Path(pids_path, "pids.max").read_text().strip() == "128"
    finally:
        await client.aclose()
        server.stop()
    assert not Path(pids_path).exists()  # removed when the desktop closed


def test_without_limits_option_the_server_runs_uncapped_only_when_asked():
    assert parse_caps(False) is None
    assert parse_caps(True) == Caps()
    assert parse_caps({"pids": 64, "memory": "1.5g"}) == Caps(memory=3 << 29, pids=64)
    assert parse_caps({"cpus": 1}) == Caps(cpus=1.0)
    for bad in ({"pid": 1}, {"memory": "lots"}, {"cpu_weight": 0}, {"cpus": -1}, "yes"):
        with pytest.raises(ValueError, match="limits"):
            parse_caps(bad)


def _fake_v2(root: Path) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.subtree_control").write_text("\n")
    return root


def test_v2_files_in_a_fake_cgroup_tree(tmp_path, monkeypatch):
    """cgroup v2 file names and values, on a directory tree standing in for /sys/fs/cgroup
    (a real v2 kernel was not available here; the kernel makes the files, so they are made
    beforehand as it would)."""
    root = _fake_v2(tmp_path / "cg")
    parent, path = root / "legato", root / "legato" / "d1"
    path.mkdir(parents=True)
    (parent / "cgroup.subtree_control").write_text("\n")
    for name in ("memory.swap.max", "io.weight"):
        (path / name).write_text("max\n")
    caps = Caps(memory=1 << 30, pids=300, cpu_weight=50, io_weight=200, cpus=1.5)
    assert cgroup_version(root) == 2
    group = make_cgroup("d1", caps, root)
    assert (root / "cgroup.subtree_control").read_text().split() == [
        "+pids",
        "+memory",
        "+cpu",
        "+io",
    ]
    assert (path / "pids.max").read_text() == "300\n"
    assert (path / "memory.max").read_text() == f"{1 << 30}\n"
    assert (path / "memory.swap.max").read_text() == "0\n"
    assert (path / "cpu.weight").read_text() == "50\n"
    assert (path / "cpu.max").read_text() == "150000 100000\n"
    assert (path / "io.weight").read_text() == "default 200\n"
    assert group.procs == [path / "cgroup.procs"]
    (path / "pids.events").write_text("max 0\n")
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 0\n")
    assert group.counts() == {"pids": 0, "memory": 0}
    limits = DesktopLimits(caps, "d1", tmp_path / "sandbox", cgroup_root=root)
    limits.cgroup = group
    limits.rebase()
    assert limits.check() is None  # memory.max reached (reclaim) is no hit; an OOM kill is
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    assert limits.check() == "memory"
    limits.rebase()
    (path / "pids.events").write_text("max 3\n")
    assert limits.check() == "pids"


def test_v2_without_the_controllers_refuses_with_the_fix(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset io\n")
    from legato_pipelines.desktops.server.limits import LimitsError

    with pytest.raises(LimitsError, match="limits=false"):
        make_cgroup("d1", Caps(), root)
    with pytest.raises(LimitsError, match="limits=false"):
        make_cgroup("d1", Caps(), tmp_path / "nothing")


@needs_root
def test_v1_join_places_a_process_before_it_runs(tmp_path):
    """The join prefix puts the process in the cgroup before its command runs (the command
    reads its own cgroup), on this host's cgroups (v1 here)."""
    import subprocess

    if cgroup_version() == 0:
        pytest.skip("no cgroup hierarchy")
    limits = DesktopLimits(Caps(pids=50), f"test-{os.getpid()}", tmp_path / "sandbox")
    limits.cgroup = make_cgroup(limits.name, limits.caps)
    try:
        out = subprocess.run(
            limits.join_argv(["cat", "/proc/self/cgroup"]), capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert f"legato-{limits.name}" in out.stdout
        assert out.stdout.count(f"legato-{limits.name}") >= 2  # pids and memory
    finally:
        limits.close()


def test_own_process_table_is_this_process_subtree_only():
    """A desktop server's scans read its own processes (children made by any thread, their
    children, zombies), not the host's: the cost of a scan no longer grows with another
    desktop's fork bomb."""
    import subprocess

    from legato_pipelines.desktops.server.procs import descendants, own_process_table

    class ProcInfo:  # a process not (yet) in the table
        state = ""

    box: list = []
    thread = threading.Thread(
        target=lambda: box.append(subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"]))
    )
    thread.start()
    thread.join()
    (shell,) = box
    done = subprocess.Popen(["true"])
    sleeps: set[int] = set()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            table = own_process_table()
            below = [table[p].comm for p in descendants(shell.pid, table)]
            if below == ["sleep", "sleep"] and table.get(done.pid, ProcInfo).state == "Z":
                break
            time.sleep(0.02)
        assert os.getpid() in table and shell.pid in table
        sleeps = descendants(shell.pid, table)
        assert [table[p].comm for p in sleeps] == ["sleep", "sleep"]
        assert table[done.pid].state == "Z"  # not reaped yet: still listed
        assert 1 not in table and os.getppid() not in table
    finally:
        for pid in sleeps:
            os.kill(pid, 9)
        shell.kill()
        shell.wait()
        done.wait()


@needs_xvfb
@needs_root
@pytest.mark.desktop
async def test_a_killed_servers_disk_and_cgroup_do_not_outlive_it():
    """SIGKILL leaves the server no chance to unmount its disk image or remove its cgroup:
    the one who removes its state directory unmounts the image first (``release_disk``:
    the loop device is freed), and the next server removes the empty cgroup of an ended one."""
    import subprocess

    server = RunningServer(320, 240, extra_args=("--limits", json.dumps(SMALL)))
    client = server.client()
    paths = (await client.health())["limits"]["paths"]
    await client.aclose()
    mountpoint = Path(server.state) / "sandbox"
    assert os.path.ismount(mountpoint)
    server.proc.kill()
    server.proc.wait()
    server.stop()
    assert not os.path.ismount(mountpoint)
    assert all(Path(p).exists() for p in paths)  # nobody removed it yet
    deadline = time.monotonic() + 10
    while any(Path(p, "cgroup.procs").read_text().strip() for p in paths):
        assert time.monotonic() < deadline, "the killed server's sandbox lives on"
        time.sleep(0.1)
    # unmounted lazily: the loop device goes once the dying sandbox lets go of the filesystem
    while server.state in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "the killed server's loop device is still attached"
        time.sleep(0.1)
    second = RunningServer(320, 240, extra_args=("--limits", json.dumps(SMALL)))
    second.stop()
    assert not any(Path(p).exists() for p in paths)


@pytest.mark.parametrize(
    "value, message",
    [
        ('{"pid": 3}', "unknown key(s) ['pid']"),
        ('{"memory": "lots"}', "memory must be bytes or a size such as 4g"),
        ("maybe", "--limits"),
    ],
)
def test_legato_desktop_serve_refuses_bad_limits_naming_the_key(value, message):
    import subprocess
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "desktop", "serve", "--limits", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0
    assert message in bad.stdout + bad.stderr
