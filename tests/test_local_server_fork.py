"""Desktop servers forked from one preloaded template (``server/template.py``): real
template, real forked servers, real Xvfb. Forked servers serve with their own tokens, are the
template's children, never see the policy key, end on ``stop()``/``kill()`` and with their
template; a dead template makes the next start spawn instead."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest

from legato_pipelines.desktops.client import DesktopClient
from legato_pipelines.desktops.server.desktop import ServerProcess
from legato_pipelines.desktops.server.procs import descendants, process_table
from legato_pipelines.errors import DesktopError
from legato_pipelines.policy.key import API_KEY_ENV
from tests.desktop_local_support import needs_xvfb, no_shared_servers  # noqa: F401

pytestmark = [needs_xvfb, pytest.mark.desktop, pytest.mark.usefixtures("no_shared_servers")]


def ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except FileNotFoundError:
        return None


def below(pid: int, comm: str | None = None) -> set[int]:
    """The processes below ``pid`` (named ``comm`` when given)."""
    table = process_table()
    return {p for p in descendants(pid, table) if comm is None or table[p].comm == comm}


def gone(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still exist (zombies included)."""
    return {p for p in pids if os.path.exists(f"/proc/{p}")}


def wait_until(check, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def server() -> ServerProcess:
    return ServerProcess(width=800, height=600, sandbox=False, fork=True)


async def ask(s: ServerProcess, what: str):
    """``DesktopClient.<what>()`` of server ``s`` (``platform``, ``health``), on a client of
    its own token."""
    client = DesktopClient(s.url, s.token)
    try:
        return await getattr(client, what)()
    finally:
        await client.aclose()


async def test_two_servers_forked_from_one_template_serve_with_their_own_tokens(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "policy-secret-of-the-test")
    a, b = server(), server()
    try:
        await asyncio.gather(a.start(), b.start())
        assert a.forked and b.forked and a.alive() and b.alive()
        template = a._lease.pid
        assert b._lease is a._lease and template not in (None, os.getpid())
        assert ppid(a.pid) == ppid(b.pid) == template  # not our children
        assert a.token != b.token
        assert await ask(a, "platform") == await ask(b, "platform") == "Linux"
        # the template froze its imports' objects before the fork (gc.freeze): a child's full
        # collection neither scans nor copies them
        assert [(await ask(s, "health"))["gc_frozen"] > 10_000 for s in (a, b)] == [True, True]
        # what a server loads at its first observation came with the fork (Pillow's C core,
        # for the observations' PNG, seen in the forked server's maps before any observation)
        with open(f"/proc/{a.pid}/maps") as f:
            maps = f.read()
        assert "PIL/_imaging" in maps
        wrong = DesktopClient(a.url, b.token)  # b's token does not open a
        with pytest.raises(DesktopError, match="401"):
            await wrong.platform()
        await wrong.aclose()
        xvfb = {s.pid: below(s.pid, "Xvfb") for s in (a, b)}
        assert all(len(x) == 1 for x in xvfb.values())
        for pid in (template, a.pid, b.pid, *xvfb[a.pid], *xvfb[b.pid]):
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            assert API_KEY_ENV.encode() not in environ and b"policy-secret" not in environ
        a_pid = a.pid
        await a.stop()
        assert not a.alive() and a.pid is None
        assert wait_until(lambda: not gone({a_pid, *xvfb[a_pid]}))
        assert below(template, "Xvfb") == xvfb[b.pid]  # b's desktop only
        assert ppid(template) == os.getpid()  # the template outlives a while b holds it
        b_pid = b.pid
        await b.stop()
        assert wait_until(lambda: not gone({b_pid, *xvfb[b_pid], template}))
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_a_dead_template_makes_the_next_start_spawn(caplog):
    a, b = server(), server()
    try:
        await a.start()
        assert a.forked
        os.kill(a._lease.pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING):
            await b.start()
        assert not b.forked and b.alive()
        assert ppid(b.pid) == os.getpid()  # spawned: our child
        assert "spawning it" in caplog.text
        assert await ask(b, "platform") == "Linux"
        assert (await ask(b, "health"))["gc_frozen"] == 0  # nothing frozen in a spawned server
    finally:
        await asyncio.gather(a.stop(), b.stop())
    assert wait_until(lambda: below(os.getpid(), "Xvfb") == set())


async def test_killing_the_template_ends_its_servers_and_their_desktops():
    a, b = server(), server()
    try:
        await asyncio.gather(a.start(), b.start())
        pids = {a.pid, b.pid}
        xvfb = below(a.pid, "Xvfb") | below(b.pid, "Xvfb")
        assert len(xvfb) == 2
        os.kill(a._lease.pid, signal.SIGKILL)
        # SIGTERM from the parent-death signal: the servers shut their displays down
        assert wait_until(lambda: not gone(pids | xvfb))
        assert not a.alive() and not b.alive()
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_kill_of_a_forked_server_ends_it():
    a = server()
    try:
        await a.start()
        assert a.forked
        pid, template = a.pid, a._lease.pid
        a.kill()
        assert wait_until(lambda: not a.alive(), 5.0)
        assert wait_until(lambda: not gone({pid}), 5.0)  # reaped by the template
    finally:
        await a.stop()
    assert wait_until(lambda: not gone({template}), 10.0)  # the last lease is given back


async def test_a_forked_server_that_fails_to_start_leaves_nothing():
    """Its port is taken: the forked server exits before READY; start() raises, and neither
    the server nor the template is left."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        s = ServerProcess(
            width=800, height=600, sandbox=False, fork=True, port=taken.getsockname()[1]
        )
        with pytest.raises(DesktopError, match="exited before it was ready"):
            await s.start()
    assert s.forked and s.pid is None and s._lease is None and s.state_dir is None
    assert wait_until(lambda: templates() == set(), 10.0)


def templates() -> set[int]:
    """Desktop server templates below this process."""
    found = set()
    for pid in below(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"desktops.server.template" in f.read():
                    found.add(pid)
        except OSError:
            continue
    return found
