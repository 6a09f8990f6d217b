"""``legato desktop serve``: real servers on loopback, token handling, clean shutdown."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV
from tests.desktop_local_support import needs_xvfb, proc_state

pytestmark = [needs_xvfb, pytest.mark.desktop]


def free_port_pair() -> int:
    """A port p such that p and p+1 are free on 127.0.0.1 (both bound once to check)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port pair")


def start_cli(port: int, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "legato_pipelines",
            "desktop",
            "serve",
            "--count",
            "2",
            "--port-start",
            str(port),
            "--width",
            "640",
            "--height",
            "480",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_servers(proc: subprocess.Popen, port: int, token: str) -> list[int]:
    """Poll both ports until they answer; return the server pids from their health."""
    pids = []
    deadline = time.monotonic() + 60
    for p in (port, port + 1):
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                r = httpx.get(
                    f"http://127.0.0.1:{p}/legato/health",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=2,
                )
                pids.append(r.json()["pid"])
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "servers did not come up"
                time.sleep(0.2)
    return pids


def wait_gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(proc_state(pid) in (None, "Z") for pid in pids):
            return True
        time.sleep(0.1)
    return False


def each_server(port: int, token: str, method: str, route: str, **kwargs) -> list[dict]:
    """The JSON answer of ``route`` from both served desktops (ports ``port``, ``port + 1``),
    each checked to be 200."""
    answers = []
    for p in (port, port + 1):
        r = httpx.request(
            method,
            f"http://127.0.0.1:{p}{route}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            **kwargs,
        )
        assert r.status_code == 200, r.text
        answers.append(r.json())
    return answers


def refused(flag: str, value: str) -> str:
    """What ``legato desktop serve FLAG VALUE`` says when it refuses the value (it must)."""
    bad = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "desktop", "serve", flag, value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0
    return bad.stdout + bad.stderr


def test_serve_with_the_token_from_the_environment_and_stop_on_sigterm():
    port = free_port_pair()
    token = "test-token-" + os.urandom(8).hex()
    proc = start_cli(port, dict(os.environ, **{DEFAULT_TOKEN_ENV: token}))
    try:
        pids = wait_for_servers(proc, port, token)
        assert httpx.get(f"http://127.0.0.1:{port}/legato/health").status_code == 401
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert f"http://127.0.0.1:{port + 1}" in out
        assert token not in out + err
        assert wait_gone(pids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_ready_source_is_the_servers_default_source_of_the_ready_wait():
    """--ready-source poll: a wait that names no source polls frames (the default watches the
    X server's drawing reports); a bad value is refused naming the flag and the choices."""
    port = free_port_pair()
    token = "test-token-" + os.urandom(8).hex()
    proc = start_cli(port, dict(os.environ, **{DEFAULT_TOKEN_ENV: token}), "--ready-source", "poll")
    try:
        wait_for_servers(proc, port, token)
        for answer in each_server(port, token, "POST", "/legato/wait", json={"mode": "eval"}):
            assert answer["source"] == "poll"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    said = refused("--ready-source", "x")
    assert "--ready-source must be one of damage, poll, got 'x'" in said


def test_session_vm_serves_desktops_with_the_vms_panels():
    """--session vm: the served desktops run the VM's top bar and dock (two tint2 panels, the
    server's infrastructure); a bad value is refused naming the flag and the choices."""
    from legato_pipelines.desktops.server import vm_look

    if vm_look.missing():
        pytest.skip(f"apt-get install {' '.join(vm_look.missing())}")
    port = free_port_pair()
    token = "test-token-" + os.urandom(8).hex()
    proc = start_cli(port, dict(os.environ, **{DEFAULT_TOKEN_ENV: token}), "--session", "vm")
    try:
        wait_for_servers(proc, port, token)
        for answer in each_server(port, token, "GET", "/legato/processes"):
            assert [x["comm"] for x in answer["infra"]].count("tint2") == 2, answer
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    said = refused("--session", "gnome")
    assert "unknown desktop session 'gnome'; choose one of plain, vm" in said


def test_generated_token_goes_to_a_private_file_and_servers_die_with_the_cli(tmp_path):
    port = free_port_pair()
    token_file = tmp_path / "desktop.token"
    env = {k: v for k, v in os.environ.items() if k != DEFAULT_TOKEN_ENV}
    state_dirs = lambda: set(Path(tempfile.gettempdir()).glob("legato-desktop-*"))  # noqa: E731
    before = state_dirs()
    proc = start_cli(port, env, "--token-file", str(token_file))
    try:
        deadline = time.monotonic() + 30
        while not token_file.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.1)
        token = token_file.read_text().strip()
        assert token and (token_file.stat().st_mode & 0o777) == 0o600
        pids = wait_for_servers(proc, port, token)
        proc.kill()  # SIGKILL: no cleanup in the CLI; the servers' parent-death signal stops them
        out, err = proc.communicate(timeout=10)
        assert token not in out + err and re.search(str(token_file), err.replace("\n", ""))
        assert wait_gone(pids)
        deadline = time.monotonic() + 10
        while state_dirs() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not state_dirs() - before  # the servers removed their state directories
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_second_serve_reuses_the_generated_token(tmp_path, monkeypatch):
    from legato_pipelines.cli.desktop import _token

    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    first, path = _token(tmp_path / "t" / "desktop.token")
    second, _ = _token(tmp_path / "t" / "desktop.token")
    assert first == second and (path.stat().st_mode & 0o777) == 0o600
    monkeypatch.setenv(DEFAULT_TOKEN_ENV, "from-env")
    assert _token(tmp_path / "t" / "desktop.token") == ("from-env", None)


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--prebuild", "gimp"), "--prebuild must be libreoffice or none, got gimp"),
        (
            ("--prebuild", "none", "--prebuild", "libreoffice"),
            "--prebuild none cannot be combined with an app",
        ),
    ],
)
def test_a_bad_prebuild_is_refused_naming_the_flag(flags, message):
    bad = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "desktop", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0
    assert message in bad.stdout + bad.stderr
