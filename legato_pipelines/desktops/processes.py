"""Child processes of the desktops, spawned by us or forked from a template, behind one face.

A process we spawned is asyncio's (:class:`Spawned`: its exit code is known). A process forked
from a *template* (the osworld worker template, ``osworld_worker/template.py``; the desktop server
template, ``server/template.py``) is the template's child, not ours: it is watched and
signalled through a pidfd (:class:`PidfdProcess`; ``os.pidfd_open``, Linux >= 5.3: no pid
reuse race) and its exit code is unknown. Both offer ``pid``, ``returncode``, ``exited``,
``send_signal``, ``kill`` and ``wait``. A process spawned before the event loop ran (a
template started on the command's first line, ``desktops/early.py``) joins the loop as an
:class:`AdoptedProcess`, which stands in for asyncio's process object.

Also what both templates share: :class:`LoopShared` (one template per interpreter per event
loop, counted by lease) and :class:`ForkRendezvous` (the private Unix socket a forked child
connects to, and its pidfd until it is adopted).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DesktopError
from ..scratch import scratch_dir


class Spawned:
    """A process we spawned: asyncio's process (``returncode`` is its exit code)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc, self.pid = proc, proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def exited(self) -> bool:
        return self.proc.returncode is not None

    def send_signal(self, signum: int) -> None:
        """Raises ``ProcessLookupError`` once the process has been reaped."""
        self.proc.send_signal(signum)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    async def wait(self) -> int | None:
        return await self.proc.wait()


def pdeathsig_guard() -> list[str]:
    """The argv prefix that ties a child to this process: ``setpriv --pdeathsig TERM --`` (it
    gets SIGTERM when the thread that spawned it ends), ``[]`` where ``setpriv`` is missing."""
    return ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


@dataclass
class EarlyProcess:
    """A process spawned before the event loop ran (:func:`spawn_early`): its command line
    ``argv``, whole environment ``env``, working directory ``cwd`` (``None``: this process's)
    and the ``Popen`` (stdin and stdout are pipes; stderr goes to ``log_path`` when set)."""

    argv: list[str]
    env: dict[str, str]
    popen: subprocess.Popen
    cwd: str | None = None
    log_path: str | None = None


#: spawned early and not taken yet, in the order they were spawned
_early: list[EarlyProcess] = []
_stop_at_exit: list = []  # stop_early once registered with atexit


def early_processes() -> int:
    """How many processes :func:`spawn_early` started that nobody took yet."""
    return len(_early)


def take_early(argv: Sequence[str], env: Mapping[str, str]) -> EarlyProcess | None:
    """The process :func:`spawn_early` started with exactly this command line and environment,
    still running, now the caller's (it stops it; :meth:`AdoptedProcess.adopt` joins it to
    the loop); ``None`` when there is none. One spawned with this command line and another
    environment is stopped (the caller starts its own)."""
    for started in list(_early):
        if started.argv != list(argv):
            continue
        _early.remove(started)
        if started.env == dict(env) and started.popen.poll() is None:
            return started
        _stop(started)
    return None


def spawn_early(argv: list[str], env: dict[str, str], *, own_dir: bool = False) -> None:
    """Spawn ``argv`` with environment ``env`` now, stdin and stdout pipes, in a session of
    its own, for a later :func:`take_early` (``desktops/early.py``: the templates, started on
    ``legato``'s first line). ``own_dir``: in a new directory (``legato-osworld-template-*``)
    with its stderr in ``worker.log`` there, as an osworld template runs. Processes nobody
    took are killed (and their directory removed) when this process exits. Raises
    ``OSError`` when it cannot be spawned."""
    cwd = scratch_dir("legato-osworld-template-") if own_dir else None
    log_path = os.path.join(cwd, "worker.log") if cwd else None
    stderr = open(log_path, "ab") if log_path else None  # noqa: SIM115 - the child's own copy
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError:
        if cwd:
            shutil.rmtree(cwd, ignore_errors=True)
        raise
    finally:
        if stderr is not None:
            stderr.close()
    if not _stop_at_exit:
        _stop_at_exit.append(atexit.register(stop_early))
    _early.append(EarlyProcess(argv, env, popen, cwd, log_path))


def _stop(started: EarlyProcess) -> None:
    """Kill a process nobody took, reap it and remove its directory."""
    with contextlib.suppress(OSError):
        started.popen.kill()
    with contextlib.suppress(OSError):
        started.popen.stdin.close()
    started.popen.stdout.close()
    started.popen.wait()
    if started.cwd:
        shutil.rmtree(started.cwd, ignore_errors=True)


def stop_early() -> None:
    """Kill every process spawned early that nobody took (run at exit)."""
    while _early:
        _stop(_early.pop())


class AdoptedProcess:
    """A child spawned with ``subprocess.Popen`` (pipes for stdin and stdout) before the event
    loop ran, taken over by the loop: the same face as asyncio's process object (``pid``,
    ``stdin`` a ``StreamWriter``, ``stdout`` a ``StreamReader``, ``returncode``,
    ``send_signal``, ``kill``, ``wait``), so :class:`Spawned` and the templates use it as
    they use a process asyncio spawned. Make one with :meth:`adopt`. Its exit is watched
    through a pidfd; ``returncode`` reaps it (``Popen.poll``)."""

    def __init__(self, popen: subprocess.Popen, stdin: asyncio.StreamWriter, stdout):
        self.popen, self.pid = popen, popen.pid
        self.stdin, self.stdout = stdin, stdout
        self._watch: PidfdProcess | None = None  # one pidfd watch shared by every wait

    @classmethod
    async def adopt(cls, popen: subprocess.Popen, *, limit: int = 2**16) -> AdoptedProcess:
        """Connect ``popen``'s stdin and stdout pipes to the running loop (``limit``: the
        reader's line limit in bytes, as asyncio's ``limit``)."""
        loop = asyncio.get_running_loop()
        try:
            stdout = asyncio.StreamReader(limit=limit, loop=loop)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), popen.stdout)
            transport, protocol = await loop.connect_write_pipe(
                lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop)), popen.stdin
            )
        except BaseException:  # cancelled or failed half-way: the process is nobody's now
            popen.kill()
            popen.wait()
            raise
        stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(popen, stdin, stdout)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, signum: int) -> None:
        """Raises ``ProcessLookupError`` once the process has been reaped."""
        if self.popen.poll() is not None:
            raise ProcessLookupError(self.pid)
        os.kill(self.pid, signum)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        """Until the process has ended; its exit code (negative: the signal that ended it)."""
        if self.popen.poll() is None:
            if not hasattr(os, "pidfd_open"):
                await asyncio.to_thread(self.popen.wait)
            else:
                if self._watch is None:  # a zombie not reaped yet still has its pidfd
                    self._watch = PidfdProcess(self.pid, os.pidfd_open(self.pid))
                await self._watch.wait()
        return self.popen.wait()


class PidfdProcess:
    """A process that is not our child, watched and signalled through its pidfd ``pidfd``
    (taken over: closed once the process has ended). Its exit code is unknown
    (``returncode`` stays ``None``). ``exited``: the pidfd is readable (the process ended)."""

    returncode = None

    def __init__(self, pid: int, pidfd: int):
        self.pid, self._pidfd = pid, pidfd
        #: resolved when the pidfd turns readable: one watch shared by every :meth:`wait`
        #: (one reader per descriptor on a loop)
        self._ended: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def exited(self) -> bool:
        if self._pidfd < 0:
            return True
        ready = select.poll()
        ready.register(self._pidfd, select.POLLIN)
        if ready.poll(0):
            self._closed()
            return True
        return False

    def send_signal(self, signum: int) -> None:
        """Raises ``ProcessLookupError`` once the process has ended (as asyncio's does)."""
        if self._pidfd < 0:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, signum)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)

    async def wait(self) -> None:
        """Until the process has ended. Any number of waiters; a cancelled one leaves the
        watch to the others."""
        if self._pidfd < 0:
            return None
        if self._ended is None:
            self._loop = asyncio.get_running_loop()
            self._ended = self._loop.create_future()
            self._loop.add_reader(self._pidfd, self._closed)
        await asyncio.shield(self._ended)
        return None

    def _closed(self) -> None:
        """The process has ended: stop watching, close the pidfd, wake the waiters."""
        if self._pidfd >= 0:
            if self._ended is not None:
                self._loop.remove_reader(self._pidfd)
                if not self._ended.done():
                    self._ended.set_result(None)
            os.close(self._pidfd)
            self._pidfd = -1


#: ``struct ucred`` of ``SO_PEERCRED``: pid, uid, gid
_PEERCRED = struct.Struct("3i")


class LoopShared:
    """One object per key (an interpreter's path) per running event loop, counted by lease
    (asyncio objects belong to one loop): :meth:`acquire` makes it with ``make(key)`` on the
    first lease (``users`` counts them); :meth:`release` ends one and the last awaits its
    ``close()`` (a later lease makes a new one). Used by the osworld worker template and the
    desktop server template."""

    def __init__(self, make: Callable[[str], Any]):
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def acquire(self, key: str) -> Any:
        """A lease on ``key``'s object on the running loop. Must be called from a coroutine."""
        shared = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        made = shared.get(key)
        if made is None:
            made = shared[key] = self._make(key)
        made.users += 1
        return made

    async def release(self, made: Any, key: str) -> None:
        """End one lease on ``made`` (``key``'s object); the last one closes it."""
        made.users -= 1
        if made.users > 0:
            return
        shared = self._by_loop.get(asyncio.get_running_loop(), {})
        if shared.get(key) is made:
            del shared[key]
        await made.close()

    @contextlib.asynccontextmanager
    async def started(self, key: str):
        """Hold a lease on ``key``'s object for the block and start it now, in the
        background (its ``ready()``: a template's imports run while the block does other
        work); whoever leases it inside the block finds it ready, or waits for the start
        under way. On exit a start still under way is cancelled (which stops it), then the
        lease is released (the last one closes it)."""
        made = self.acquire(key)
        starting = asyncio.create_task(made.ready(), name=f"start-{type(made).__name__}")
        try:
            yield made
        finally:
            if not starting.done():
                starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await self.release(made, key)


class ForkRendezvous:
    """Where a child forked from a template meets its client: a Unix socket ``path`` in a
    private directory (0700: only this user connects), listening while the block runs.
    :meth:`accept` opens the child's pidfd and waits for its connection; :meth:`adopt` hands
    the pidfd over. On exit a child not adopted is killed (SIGKILL through its pidfd), and the
    socket and its directory are removed. Raises ``DesktopError(kind="transport")`` when
    ``os.pidfd_open`` is missing (Linux < 5.3) or the child ended before it connected."""

    def __init__(self, prefix: str):
        if not hasattr(os, "pidfd_open"):
            raise DesktopError("no os.pidfd_open here (Linux only)", kind="transport")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._dir = scratch_dir(prefix)
        except BaseException:
            self._listener.close()
            raise
        self.path = os.path.join(self._dir, "s")
        self._pidfd = -1

    async def __aenter__(self) -> ForkRendezvous:
        try:
            self._listener.bind(self.path)
            self._listener.listen(1)
            self._listener.setblocking(False)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def accept(self, pid: int, timeout: float, what: str) -> socket.socket:
        """Watch child ``pid`` (its pidfd) and wait up to ``timeout`` seconds for its
        connection (non-blocking). Only a connection whose peer is ``pid`` itself counts
        (``SO_PEERCRED``): another process of this user that finds the socket is turned away,
        so it can neither pose as the child nor be handed what the child is sent. ``what``
        names the child in errors ("the forked server"). Raises ``DesktopError(kind=
        "transport")`` when the child ends before it connects, ``TimeoutError`` when it does
        not connect in time."""
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise DesktopError(f"{what} {pid} ended at once", kind="transport") from None
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        loop.add_reader(self._pidfd, lambda: ended.done() or ended.set_result(None))
        deadline = loop.time() + timeout
        accepting: asyncio.Future | None = None
        try:
            while True:
                accepting = asyncio.ensure_future(loop.sock_accept(self._listener))
                left = max(0.0, deadline - loop.time())
                await asyncio.wait({accepting, ended}, timeout=left, return_when="FIRST_COMPLETED")
                if not accepting.done():
                    if ended.done():
                        raise DesktopError(
                            f"{what} {pid} ended before it connected", kind="transport"
                        )
                    raise TimeoutError(f"{what} {pid} did not connect within {timeout:g} s")
                conn, _ = accepting.result()
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
                if _PEERCRED.unpack(creds)[0] == pid:
                    conn.setblocking(False)
                    return conn
                conn.close()  # not the child: keep listening for it
        finally:
            if accepting is not None and not accepting.done():
                accepting.cancel()
            loop.remove_reader(self._pidfd)

    def adopt(self) -> int:
        """The child's pidfd, now the caller's (the child is no longer killed on exit)."""
        pidfd, self._pidfd = self._pidfd, -1
        return pidfd

    async def __aexit__(self, *exc_info) -> None:
        if self._pidfd >= 0:  # a child that did not make it (or a cancelled start)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            os.close(self._pidfd)
            self._pidfd = -1
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)
