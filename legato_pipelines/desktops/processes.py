"""Child processes of the desktops, spawned by us or forked from a template, behind one face.

A process we spawned is asyncio's (:class:`Spawned`: its exit code is known). A process forked
from a *template* (the osworld worker template, ``osworld/template.py``; the desktop server
template, ``local/server_template.py``) is the template's child, not ours: it is watched and
signalled through a pidfd (:class:`PidfdProcess`; ``os.pidfd_open``, Linux >= 5.3: no pid
reuse race) and its exit code is unknown. Both offer ``pid``, ``returncode``, ``exited``,
``send_signal``, ``kill`` and ``wait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal


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
