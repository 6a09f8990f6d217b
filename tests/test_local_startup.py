"""Start-up of local desktops (issue 18): each desktop's osworld worker imports desktop_env
while its server starts, and a start that is cancelled (a batch that ended before its late
spares were up) stops every server it began. Real servers, real Xvfb, the real OSWorld venv."""

from __future__ import annotations

import asyncio
import os

import pytest

from legato_pipelines.desktops import open_desktops, warm_up
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.osworld_worker import acquire_template, release_template
from legato_pipelines.desktops.server import open_local_desktops
from legato_pipelines.desktops.server.procs import descendants, process_table
from legato_pipelines.errors import ConfigError
from legato_pipelines.tasks import Task
from tests.desktop_local_support import needs_xvfb, no_shared_servers  # noqa: F401
from tests.osworld_backend_support import needs_desktop_apps, needs_vm_python, osworld_python

pytestmark = [needs_xvfb, pytest.mark.desktop, pytest.mark.usefixtures("no_shared_servers")]


def servers_below_us(marker: bytes = b"legato_pipelines.desktops.server.") -> set[int]:
    """Desktop server processes (``-m legato_pipelines.desktops.server.main``, or forked from
    ``...server.template``; or others whose command line holds ``marker``) under this test
    process."""
    table = process_table()
    found = set()
    for pid in descendants(os.getpid(), table):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    found.add(pid)
        except OSError:
            continue
    return found


MKDIR = Task(
    task_id="mkdir",
    domain=None,
    source="inline",
    config={
        "instruction": "nothing",
        "config": [{"type": "execute", "parameters": {"command": "mkdir ~/made", "shell": True}}],
        "evaluator": {
            "func": "check_include_exclude",
            "result": {
                "type": "vm_command_line",
                "command": "test -d ~/made && echo yes || echo no",
                "shell": True,
            },
            "expected": {"type": "rule", "rules": {"include": ["yes"], "exclude": ["no"]}},
        },
    },
)


@pytest.mark.slow
@needs_desktop_apps
@needs_vm_python
async def test_the_grader_imports_desktop_env_while_its_server_starts():
    """Two desktops with OSWorld's grader, named from ``first``: each worker is forked from
    the template that imported desktop_env once, before it was attached (``preload``), so
    neither its ``preload`` nor its ``start`` imported anything, and each took its own
    desktop's token from the environment the fork gave it; the grader sets up and grades a
    task; after the server is killed and recovered (a new token) a new worker, forked again,
    drives it."""
    config = DesktopConfig(
        backend="local", options={"grader": "osworld", "osworld_python": osworld_python()}
    )
    desktops = await open_local_desktops(config, 2, first=2)
    try:
        assert [d.name for d in desktops] == ["local-2", "local-3"]
        assert desktops[0].server.token != desktops[1].server.token
        for d in desktops:
            assert d.grader is not None
            assert d.grader.worker.forked
            assert d.grader.last_preload["import_s"] < 0.05  # done by the template
            assert d.grader.last_start["import_s"] < 0.05  # nothing left to import
            assert d.grader.last_start["server"] == d.client.url
        d = desktops[0]
        await d.reset(MKDIR)
        assert d.setup_failures == []
        worker_pid, token = d.grader.worker.pid, d.server.token
        assert (await d.evaluate(MKDIR)).reward == 1.0
        assert d.grader.worker is None  # retired: each attempt gets a worker of its own
        d.server.kill()
        await d.recover()
        assert d.server.token != token and d.grader.worker.pid != worker_pid
        assert d.grader.worker.forked
        await d.reset(MKDIR)
        assert (await d.evaluate(MKDIR)).reward == 1.0
    finally:
        await asyncio.gather(*(d.close() for d in desktops))
    assert servers_below_us() == set()
    assert servers_below_us(b"osworld_worker/worker.py") == set()  # the template was stopped too


def templates_below_us() -> set[int]:
    """The desktop server templates this process started (``server/template.py``; the
    servers forked from one share its command line but are its children, not ours)."""
    found = set()
    for pid in servers_below_us(b"legato_pipelines.desktops.server.template"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    found.add(pid)
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.parametrize("hold_at", ["forked", "ready"])
async def test_a_cancelled_start_stops_every_server_it_began(monkeypatch, hold_at):
    """Cancelled while its servers start: none is left running (nor the template they were
    forked from), none of their state dirs. The cancel lands at a fixed point of the real
    start, whatever this machine's speed: right after each server was forked (its READY line
    not read yet), or once each had said READY (the batch's other starts still under way)."""
    from legato_pipelines.desktops.server.desktop import ServerProcess

    held: list[ServerProcess] = []
    hold = asyncio.Event()  # never set: only the cancel ends the wait
    name = "_fork_server" if hold_at == "forked" else "start"
    real = getattr(ServerProcess, name)

    async def then_hold(self, *args):
        result = await real(self, *args)
        held.append(self)
        await hold.wait()
        return result

    monkeypatch.setattr(ServerProcess, name, then_hold)
    before = servers_below_us()
    config = DesktopConfig(backend="local", options={"grader": "own"})
    opening = asyncio.create_task(open_desktops(config, 2, first=1))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    while len(held) < 2 and loop.time() < deadline and not opening.done():
        await asyncio.sleep(0.01)
    assert len(held) == 2, opening
    assert len(servers_below_us() - before - templates_below_us()) == 2
    state_dirs = [s.state_dir for s in held]
    assert all(d is not None and d.exists() for d in state_dirs)
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert servers_below_us() - before == set()
    assert not any(d.exists() for d in state_dirs)


async def test_only_desktops_started_here_open_late():
    with pytest.raises(ConfigError, match="opened late"):
        await open_desktops(DesktopConfig(backend="osworld"), 1, first=2)
    attached = DesktopConfig(backend="local", options={"urls": ["http://127.0.0.1:9"]})
    with pytest.raises(ConfigError, match="opened late"):
        await open_desktops(attached, 1, first=2)


@needs_vm_python
async def test_warm_up_starts_the_graders_template_before_any_desktop_and_stops_it():
    """``desktops.warm_up`` (entered by the engine before its policy check): the OSWorld
    graders' template and the desktop servers' template start in the background with no
    desktop open yet, and are stopped when the block ends, whether their starts had ended
    or were still under way."""
    config = DesktopConfig(
        backend="local", options={"grader": "osworld", "osworld_python": osworld_python()}
    )
    async with warm_up(config):
        for _ in range(600):  # its start is under way while the block goes on
            if servers_below_us(b"osworld_worker/worker.py"):
                break
            await asyncio.sleep(0.05)
        assert len(servers_below_us(b"osworld_worker/worker.py")) == 1
        for _ in range(600):
            if servers_below_us(b"desktops.server.template"):
                break
            await asyncio.sleep(0.05)
        assert len(servers_below_us(b"desktops.server.template")) == 1
        assert (
            servers_below_us() - servers_below_us(b"desktops.server.template") == set()
        )  # no server
        template = acquire_template(osworld_python())
        try:
            worker = await template.ready()  # the start under way, not a second one
            assert worker is not None and worker.alive()
            assert servers_below_us(b"osworld_worker/worker.py") == {worker.pid}
        finally:
            await release_template(template)
    assert servers_below_us(b"osworld_worker/worker.py") == set()
    assert servers_below_us(b"desktops.server.template") == set()
    async with warm_up(config):
        await asyncio.sleep(0.05)  # left while the templates still import
    assert servers_below_us(b"osworld_worker/worker.py") == set()
    assert servers_below_us(b"desktops.server.template") == set()


async def test_warm_up_needs_nothing_for_the_own_grader_or_other_backends():
    """No graders' template for local desktops graded by the own subset, nor anything for
    the fake backend or for servers attached by URL; a missing OSWorld interpreter is a
    ConfigError naming the option, before anything runs."""
    own = DesktopConfig(backend="local", options={"grader": "own"})
    async with warm_up(own):
        assert servers_below_us(b"osworld_worker/worker.py") == set()
    for config in (
        DesktopConfig(backend="fake"),
        DesktopConfig(backend="local", options={"grader": "own", "urls": ["http://127.0.0.1:9"]}),
    ):
        async with warm_up(config):
            await asyncio.sleep(0.2)
            assert servers_below_us(b"osworld_worker/worker.py") == set()
            assert servers_below_us(b"desktops.server.template") == set()
    missing = DesktopConfig(
        backend="local", options={"grader": "osworld", "osworld_python": "/nonexistent/python"}
    )
    with pytest.raises(ConfigError, match="osworld_python"):
        async with warm_up(missing):
            pass


def test_a_server_whose_starter_is_gone_ends_quietly_and_leaves_nothing():
    """A desktop server whose ready line finds no reader (the collector was interrupted while
    its desktops started): it shuts its display down and exits 0, without the
    ``BrokenPipeError`` traceback it used to print into the collector's terminal."""
    import glob
    import subprocess
    import sys

    from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV

    env = {**os.environ, DEFAULT_TOKEN_ENV: "t" * 24}
    cmd = [sys.executable, "-m", "legato_pipelines.desktops.server.main"]
    states = set(glob.glob("/tmp/legato-desktop-*"))
    proc = subprocess.Popen(
        [*cmd, "--width", "320", "--height", "240"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # nobody reads the ready line
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr
    assert set(glob.glob("/tmp/legato-desktop-*")) <= states  # its state directory removed
