"""Shared pieces of the local-desktop tests: a real server process on loopback, /proc checks."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest

from legato_pipelines.desktops.client import DesktopClient
from legato_pipelines.desktops.server.limits import release_disk
from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV, READY_LINE

needs_xvfb = pytest.mark.skipif(
    shutil.which("Xvfb") is None or shutil.which("openbox") is None,
    reason="Xvfb/openbox not installed (apt-get install xvfb openbox xterm l3afpad)",
)
needs_apps = pytest.mark.skipif(
    shutil.which("l3afpad") is None or shutil.which("xterm") is None,
    reason="l3afpad/xterm not installed (apt-get install xterm l3afpad)",
)


LOCAL_SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
LOCAL_SUBSET = ["local-term-sort", "local-term-mkdir", "local-edit-append", "local-edit-replace"]


def local_subset(tmp_path: Path) -> Path:
    """A task list of the four quick local-suite tasks (terminal and editor), written to tmp_path."""
    tasks = orjson.loads((LOCAL_SUITE / "tasks.json").read_bytes())
    path = tmp_path / "tasks.json"
    path.write_bytes(orjson.dumps([t for t in tasks if t["task_id"] in LOCAL_SUBSET]))
    return path


_SHARED: dict[str, RunningServer] = {}
"""The running shared servers, by :func:`server_fixture`'s arguments."""
_KEYS: dict[int, str] = {}
"""``id`` of each fixture :func:`server_fixture` made -> its arguments."""


def server_fixture(width: int = 1024, height: int = 768, **kwargs):
    """A module-scoped ``server`` fixture (assign it to a module attribute named ``server``):
    one :class:`RunningServer` for the module's tests, shared with the other modules that ask
    for the same arguments. It starts when the first of them needs it and stops after the last
    of them in this session's run (or when it died); its tests reset the desktop before use
    (:func:`client_fixture`), as they did between tests of one module. A test that needs a
    server of its own starts one (``RunningServer(...)``)."""
    key = repr((width, height, sorted(kwargs.items())))

    def server(request):
        running = _SHARED.get(key)
        if running is None or running.proc.poll() is not None:
            if not _SHARED:
                atexit.register(stop_shared_servers)  # a run ended early: nothing outlives it
            running = _SHARED[key] = RunningServer(width, height, **kwargs)
        yield running
        if running.proc.poll() is not None or not _needed_later(request, key):
            _SHARED.pop(key, None)
            running.stop()

    fixture = pytest.fixture(scope="module", name="server")(server)
    _KEYS[id(fixture)] = key
    return fixture


def _needed_later(request, key: str) -> bool:
    """Whether a test of a later module of this run uses a ``server`` fixture of ``key``."""
    items = request.session.items
    mine = [i for i, item in enumerate(items) if item.module is request.module]
    for item in items[max(mine, default=len(items)) + 1 :]:
        fixture = getattr(item.module, "server", None)
        if "server" in item.fixturenames and _KEYS.get(id(fixture)) == key:
            return True
    return False


def stop_shared_servers() -> None:
    """Stop every shared server still running."""
    while _SHARED:
        _SHARED.popitem()[1].stop()


@pytest.fixture(scope="module")
def no_shared_servers():
    """For modules that count every process below the test process (``servers_below_us``,
    ``below(os.getpid(), "Xvfb")``): the shared servers an earlier module left for a later
    one are stopped first (the later module starts its own again)."""
    stop_shared_servers()
    yield


def client_fixture():
    """A ``client`` fixture: a client of the module's ``server``, its desktop reset first."""

    @pytest.fixture
    async def client(server):
        c = server.client()
        await c.reset()
        yield c
        await c.aclose()

    return client


class RunningServer:
    """A desktop server subprocess started with a fresh token; ``client()`` makes a client."""

    def __init__(
        self,
        width: int = 1024,
        height: int = 768,
        prebuild: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        ignored_signals: tuple[signal.Signals, ...] = (),
    ):
        """``ignored_signals``: the server starts with these ignored, as a process started
        by ``nohup ... &`` does (an ignored signal stays ignored across exec)."""
        self.token = secrets.token_urlsafe(16)
        self.state = tempfile.mkdtemp(prefix="legato-test-desktop-")
        env = dict(os.environ, **(env or {}), **{DEFAULT_TOKEN_ENV: self.token})
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "legato_pipelines.desktops.server.main",
                "--width",
                str(width),
                "--height",
                str(height),
                "--state-dir",
                self.state,
                *[arg for app in prebuild for arg in ("--prebuild", app)],
                *extra_args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: _ignore(ignored_signals)) if ignored_signals else None,
        )
        line = self.proc.stdout.readline()
        if not line.startswith(READY_LINE):
            self.proc.kill()
            shutil.rmtree(self.state, ignore_errors=True)
            raise RuntimeError(f"desktop server did not start (exit {self.proc.wait()})")
        self.info = json.loads(line[len(READY_LINE) :])
        self.url = self.info["url"]

    def client(self) -> DesktopClient:
        return DesktopClient(self.url, self.token)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        release_disk(Path(self.state))  # the disk image of a server killed with SIGKILL
        shutil.rmtree(self.state, ignore_errors=True)


def _ignore(signals: tuple[signal.Signals, ...]) -> None:
    for signum in signals:
        signal.signal(signum, signal.SIG_IGN)


def proc_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (``Z`` zombie), or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def zombie_children(pid: int) -> list[int]:
    """Zombie processes whose parent is ``pid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == pid:
                found.append(int(name))
    return found


def still_alive(watched: set[tuple[int, str]], timeout: float = 10.0) -> list[tuple[int, str]]:
    """Which of ``watched`` (pid, comm) still run (not zombies) after up to ``timeout``
    seconds of waiting for them all to end; ``[]`` as soon as none does."""
    from legato_pipelines.desktops.server.procs import process_table

    deadline = time.monotonic() + timeout
    while True:
        now = process_table()
        alive = sorted(
            (pid, comm)
            for pid, comm in watched
            if pid in now and now[pid].comm == comm and now[pid].state != "Z"
        )
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
