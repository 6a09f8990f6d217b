"""Shared pieces of the scale-out tests: real Postgres and Redis on loopback, and processes
started in their own process groups (``start_new_session``: the ``set -m`` of
docs/deployment.md §5), each stopped by its group id.

Nothing here listens on anything but 127.0.0.1. Every process a test starts goes through
:class:`Processes`, whose ``stop_all`` sends SIGTERM to each group, SIGKILL after a grace
period, and reports which groups needed it.
"""

from __future__ import annotations

import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def pg_tool(name: str) -> str | None:
    """Path of a PostgreSQL server tool (``initdb``, ``pg_ctl``): PATH, else Debian's
    ``/usr/lib/postgresql/<major>/bin``."""
    found = shutil.which(name)
    if found:
        return found
    for d in PG_BIN_DIRS:
        if (d / name).is_file():
            return str(d / name)
    return None


needs_postgres = pytest.mark.skipif(
    pg_tool("initdb") is None or pg_tool("pg_ctl") is None,
    reason="PostgreSQL server not installed (apt-get install postgresql)",
)
needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server not installed (apt-get install redis-server)",
)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 right now, below the
    kernel's ephemeral range (so no outgoing connection takes one before its server binds)."""
    rng = random.Random()
    high = _ephemeral_low() - count
    for _ in range(200):
        start = rng.randrange(20000, high)
        if all(_bindable(start + i) for i in range(count)):
            return start
    raise RuntimeError(f"no {count} consecutive free ports below {high}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (see :func:`free_ports`)."""
    return free_ports(1)


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Block until 127.0.0.1:``port`` accepts connections; ``RuntimeError`` after ``timeout`` s
    or when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


@dataclass
class Processes:
    """Processes a test started, each the leader of its own process group."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, log: Path, **kwargs) -> subprocess.Popen:
        """Start ``argv`` in a new session (own process group), output to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
        )
        out.close()
        self.procs.append((name, proc))
        return proc

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> bool:
        """Signal the group of process ``name``; SIGKILL it after ``timeout`` s. True when
        SIGTERM was enough."""
        for n, proc in self.procs:
            if n == name:
                return _stop_group(proc, sig, timeout)
        raise KeyError(name)

    def stop_all(self, timeout: float = 20.0) -> list[str]:
        """Stop every group (newest first); return the names that needed SIGKILL."""
        killed = []
        for name, proc in reversed(self.procs):
            if not _stop_group(proc, signal.SIGTERM, timeout):
                killed.append(name)
        return killed

    def alive(self) -> list[str]:
        """Names whose process group still has a member."""
        return [n for n, p in self.procs if _group_alive(p.pid)]

    def forget(self, proc: subprocess.Popen) -> None:
        """Drop a process that has exited (e.g. before it could listen) from the list, so
        ``stop(name)`` finds the one started again under the same name."""
        proc.wait(10)
        self.procs = [(n, p) for n, p in self.procs if p is not proc]

    def start_listening(
        self,
        name: str,
        argv: Callable[[int], list[str]],
        *,
        log: Path,
        ready: str,
        count: int = 1,
        timeout: float = 60.0,
        **kwargs,
    ) -> tuple[subprocess.Popen, int]:
        """Start ``argv(port)`` on ``count`` fresh consecutive ports and wait until its log
        shows ``ready``; return the process and the first port.

        A port found free can be taken by another process before the server binds it: when the
        process exits saying so (:data:`PORT_TAKEN`), it is started again on new ports, up to
        :data:`START_ATTEMPTS` times. Any other early exit, or no ``ready`` after ``timeout``
        seconds, raises ``RuntimeError`` with the log's tail."""
        for attempt in range(1, START_ATTEMPTS + 1):
            port = free_ports(count)
            offset = log.stat().st_size if log.exists() else 0
            proc = self.start(name, argv(port), log=log, **kwargs)
            deadline = time.monotonic() + timeout
            while True:
                text = _read_from(log, offset)
                if ready in text:
                    return proc, port
                if proc.poll() is not None:
                    if PORT_TAKEN in text and attempt < START_ATTEMPTS:
                        self.forget(proc)
                        break
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {text[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not ready after {timeout:g} s: {text[-2000:]}")
                time.sleep(0.1)
        raise AssertionError("unreachable")


PORT_TAKEN = "Address already in use"
"""What a server (desktop server, redis, moto's werkzeug) says when its port was taken."""
START_ATTEMPTS = 5


def _read_from(log: Path, offset: int) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group of zombies only: treat as gone once the leader is reaped
    return True


def _stop_group(proc: subprocess.Popen, sig: int, timeout: float) -> bool:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        proc.poll()
        return True
    deadline = time.monotonic() + timeout
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    while time.monotonic() < deadline and _group_alive(proc.pid):
        time.sleep(0.1)
    if _group_alive(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        return False
    return True


class Postgres:
    """A private PostgreSQL cluster on 127.0.0.1 (``initdb`` + ``pg_ctl``, trust auth, run as
    the ``postgres`` user when this process is root). ``create_db(name)`` adds a database."""

    user = "postgres"

    def __init__(self):
        # its own directory under /tmp (not pytest's 0700 tree): the postgres user must reach it
        self.base = Path(tempfile.mkdtemp(prefix="legato-pg-"))
        self.data = self.base / "pgdata"
        self.port = free_port()
        self.log = self.base / "postgres.log"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def start(self) -> Postgres:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        subprocess.run(
            self._as_owner(
                [
                    pg_tool("initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
        )
        for attempt in range(1, START_ATTEMPTS + 1):  # again on a new port if it was taken
            offset = self.log.stat().st_size if self.log.exists() else 0
            opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base} -c fsync=off"
            started = subprocess.run(
                self._as_owner(
                    [pg_tool("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.log),
                     "-w", "start"]
                ),
                capture_output=True,
            )  # fmt: skip
            if started.returncode == 0:
                return self
            text = _read_from(self.log, offset)
            if PORT_TAKEN not in text or attempt == START_ATTEMPTS:
                raise RuntimeError(f"postgres did not start: {started.stderr!r} {text[-2000:]}")
            self.port = free_port()
        raise AssertionError("unreachable")

    def create_db(self, name: str) -> None:
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres")
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            con.close()

    def env(self, db: str) -> dict[str, str]:
        """The ``DAGSTER_PG_*`` variables of deploy/*/dagster.yaml for database ``db``."""
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": "unused-trust-auth",
            "DAGSTER_PG_DB": db,
        }

    def stop(self) -> None:
        subprocess.run(
            self._as_owner([pg_tool("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(self.base, ignore_errors=True)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


SERVE_ROW = re.compile(r"(http://127\.0\.0\.1:\d+)\D+?(\d+)\s*│?\s*$", re.M)


def tasks(n: int) -> list[dict]:
    """``n`` quick inline tasks: no setup, graded by OSWorld's ``infeasible`` metric."""
    return [
        {
            "task_id": f"remote-{i:02d}",
            "config": {
                "instruction": f"Task {i}: look at the screen, then stop.",
                "config": [],
                "evaluator": {"func": "infeasible"},
            },
        }
        for i in range(n)
    ]


class Host:
    """``legato desktop serve --count N`` in its own process group: one stand-in host.

    Started on fresh ports, again on new ones when a server reports its port taken
    (:meth:`Processes.start_listening`); ``urls`` are the ports it listens on."""

    def __init__(self, procs: Processes, name: str, count: int, token: str, log_dir: Path):
        self.name, self.count = name, count
        self.log = log_dir / f"{name}.log"
        env = dict(os.environ, **{DEFAULT_TOKEN_ENV: token})
        env.pop("LEGATO_POLICY_KEY", None)
        self.proc, self.port_start = procs.start_listening(
            name,
            lambda port: [
                sys.executable,
                "-m",
                "legato_pipelines",
                "desktop",
                "serve",
                "--count",
                str(count),
                "--host",
                "127.0.0.1",
                "--port-start",
                str(port),
                "--width",
                "640",
                "--height",
                "480",
            ],  # fmt: skip
            log=self.log,
            ready=f"{count} local desktop(s)",  # the title of the table printed when all are up
            count=count,
            timeout=120,
            env=env,
        )
        self.urls = [f"http://127.0.0.1:{self.port_start + i}" for i in range(count)]

    def wait_ready(self, timeout: float = 60.0) -> dict[str, int]:
        """Block until the CLI printed its table of servers; return {url: server pid}."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            rows = dict(SERVE_ROW.findall(self.log.read_text(errors="replace")))
            if all(u in rows for u in self.urls):
                return {u: int(rows[u]) for u in self.urls}
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready: {self.log.read_text()[-2000:]}")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
