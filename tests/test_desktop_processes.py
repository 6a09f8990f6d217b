"""desktops/processes.py: where a forked child meets its client (ForkRendezvous). Real
processes and real Unix sockets, no desktop."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest

from legato_pipelines.desktops.processes import ForkRendezvous
from legato_pipelines.errors import DesktopError

CHILD = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"child\\n")
time.sleep(5)
"""


async def test_only_the_childs_own_connection_is_accepted():
    """Another process of this user (here: the test itself) connects first and is turned
    away (SO_PEERCRED); the child's connection is the one returned."""
    async with ForkRendezvous("legato-test-") as meeting:
        child = subprocess.Popen([sys.executable, "-c", CHILD, meeting.path, "0.5"])
        intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            intruder.connect(meeting.path)
            intruder.sendall(b"intruder\n")
            conn = await meeting.accept(child.pid, 10.0, "the child")
            try:
                loop = asyncio.get_running_loop()
                assert await loop.sock_recv(conn, 64) == b"child\n"
            finally:
                conn.close()
            try:  # closed on it (a reset, since what it sent was never read)
                assert intruder.recv(64) == b""
            except ConnectionResetError:
                pass
        finally:
            intruder.close()
            child.kill()
            child.wait()


async def test_a_child_that_ends_before_it_connects_fails_at_once_not_at_the_timeout():
    async with ForkRendezvous("legato-test-") as meeting:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
        t0 = time.monotonic()
        with pytest.raises(DesktopError, match="ended before it connected"):
            await meeting.accept(child.pid, 20.0, "the child")
        assert time.monotonic() - t0 < 10.0
        child.wait()


async def test_a_child_that_never_connects_times_out_and_is_killed():
    async with ForkRendezvous("legato-test-") as meeting:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with pytest.raises(TimeoutError):
            await meeting.accept(child.pid, 0.5, "the child")
    assert child.wait(timeout=5) == -9  # not adopted: SIGKILLed at the block's end
