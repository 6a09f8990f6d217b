"""The processes of one desktop: spawn them as the desktop user, find them, kill them by PID.

The desktop server makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so
every process the task starts stays in the server's process tree even when it daemonizes
(dbus helpers, ``nohup app &``): orphans are re-parented to the server, not to PID 1. "The
task's processes" are then simply the server's descendants minus its infrastructure (Xvfb,
the window manager). They are killed by PID (SIGSTOP first so none can fork while the tree
is being killed, then SIGKILL), never by name: other processes on the machine carry the same
names (docs/local-desktop.md §9).

Reaping: a ``Popen`` reaps its own child; every other zombie child (re-parented orphans) is
reaped by PID with ``waitpid(pid, WNOHANG)``. A blanket ``waitpid(-1)`` would steal exit
statuses from ``Popen`` objects (``/execute`` would report return code 0 for a failed
command), so spawning and reaping share a lock and a zombie is reaped only when no ``Popen``
owns it.
"""

from __future__ import annotations

import ctypes
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
#: After a timed-out command's process group is killed: how long its pipes are read on (for
#: what it wrote last) and the kill is waited for.
KILLED_DRAIN_S = 1.0
#: [bytes] the most stdout plus stderr one command run to completion (``ProcessTable.run``:
#: ``/execute``, ``/file``, setup and grader commands) may hand the server: past it the
#: command's process group is killed and :class:`OutputTooLarge` raised. The output is held in
#: the server's memory, outside the sandbox's memory cap: a red team's 1 GiB sparse file read
#: through ``/file`` took the server from 59 MiB to 3 GiB. OSWorld's largest task files (videos,
#: slide decks) are tens of MiB.
MAX_OUTPUT_BYTES = 256 * 1024 * 1024


class OutputTooLarge(OSError):
    """A command wrote more than :data:`MAX_OUTPUT_BYTES` (``limit``); it was killed. ``output``
    holds the first 64 KiB of its stdout (no copy of the rest is made)."""

    def __init__(self, argv: Sequence[str] | str, limit: int, output: bytes):
        super().__init__(f"output larger than {limit} bytes: the command was stopped")
        self.argv, self.limit, self.output = argv, limit, output


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux ``prctl``).

    Raises ``OSError`` when the kernel refuses.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One row of ``/proc``: pid, parent pid, state letter (``Z`` = zombie) and ``comm``."""

    pid: int
    ppid: int
    state: str
    comm: str


def pidfd_exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` (``os.pidfd_open``) has ended: a pidfd polls
    readable then. Unlike a pid, a pidfd never names another process later."""
    return bool(select.select([pidfd], [], [], 0)[0])


def ended(info: ProcInfo) -> bool:
    """Whether process ``info`` runs nothing any more: a zombie with no thread left. (A main
    thread that called ``pthread_exit`` leaves its process shown as ``Z`` while the other
    threads run on.)"""
    if info.state != "Z":
        return False
    try:
        return len(os.listdir(f"/proc/{info.pid}/task")) <= 1
    except OSError:  # reaped meanwhile
        return True


def process_table() -> dict[int, ProcInfo]:
    """Every process visible in ``/proc``, by pid (processes that vanish mid-scan are skipped).

    Read with bare ``os.open``/``os.read`` (one stat line is < 1 KiB): half the CPU of file
    objects, and the servers scan often (reaping, kills at each reset, the heavy-app look):
    measured 37 -> 19 us per process; a host with 4 desktops runs ~200 (issue 18).
    """
    table: dict[int, ProcInfo] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            _add_stat(table, int(name))
    return table


def own_process_table(root: int | None = None, depth: int | None = None) -> dict[int, ProcInfo]:
    """``root`` (default: this process) and every process below it, by pid: what a desktop
    server's scans need (its task's and its infrastructure's processes are all its
    descendants: it is their subreaper). Found through ``/proc/PID/task/TID/children`` from
    ``root`` down, so the cost follows the desktop's own process count, not the host's: a fork
    bomb in another desktop (thousands of processes, up to that desktop's pids cap) made every
    server's scans, and so every desktop's steps, several times slower (issue 30). The
    kernel's children lists may miss a process forked or re-parented during the walk; the
    callers that kill re-scan until nothing is left. ``depth``: how many generations below
    ``root`` to read (``1``: its children only; ``None``: all)."""
    root = os.getpid() if root is None else root
    table: dict[int, ProcInfo] = {}
    stack = [(root, 0)]
    while stack:
        pid, level = stack.pop()
        if pid in table or not _add_stat(table, pid) or level == depth:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
            except OSError:
                continue
            try:
                stack.extend((int(c), level + 1) for c in _read_all(fd).split())
            except OSError:
                pass
            finally:
                os.close(fd)
    return table


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _add_stat(table: dict[int, ProcInfo], pid: int) -> bool:
    """Read ``/proc/PID/stat`` into ``table``; ``False`` when the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return False
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return False
    finally:
        os.close(fd)
    if not raw:
        return False
    # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
    open_paren, close_paren = raw.index(b"("), raw.rindex(b")")
    rest = raw[close_paren + 2 :].split(b" ", 2)
    table[pid] = ProcInfo(
        pid,
        int(rest[1]),
        rest[0].decode(),
        raw[open_paren + 1 : close_paren].decode(errors="replace"),
    )
    return True


def descendants(root: int, table: dict[int, ProcInfo]) -> set[int]:
    """The pids below ``root`` in ``table`` (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


@dataclass(frozen=True, slots=True)
class RunAs:
    """Who a desktop process runs as: ``uid``/``gid`` (``None`` = the server's own), its
    environment (built from scratch, never inherited from the server) and working directory.

    ``prefix``: an argv that enters the desktop's sandbox (``enter.py enter ... --``, which also sets
    the user and the working directory inside); the command runs after it, a shell string as
    ``/bin/sh -c``.
    """

    env: dict[str, str]
    cwd: str
    uid: int | None = None
    gid: int | None = None
    prefix: tuple[str, ...] = ()

    def command(self, argv: Sequence[str] | str, shell: bool) -> tuple[Sequence[str] | str, bool]:
        """``(argv, shell)`` for ``Popen``: the command behind :attr:`prefix`, if any."""
        if not self.prefix:
            return argv, shell
        if shell:
            command = argv if isinstance(argv, str) else " ".join(argv)
            return [*self.prefix, "/bin/sh", "-c", command], False
        if isinstance(argv, str):
            return [*self.prefix, argv], False
        return [*self.prefix, *argv], False

    def popen_kwargs(self) -> dict:
        kwargs: dict = {"env": self.env, "cwd": self.cwd, "umask": 0o022}
        if self.uid is not None:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        return kwargs


@dataclass
class ProcessTable:
    """Spawns the desktop's processes and kills/reaps them by PID (thread-safe)."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _popens: dict[int, subprocess.Popen] = field(default_factory=dict)

    def spawn(
        self,
        argv: Sequence[str] | str,
        run_as: RunAs,
        *,
        shell: bool = False,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds: Sequence[int] = (),
    ) -> subprocess.Popen:
        """Start ``argv`` in its own session (own process group) as ``run_as``; return the Popen.

        Raises ``OSError`` (e.g. ``FileNotFoundError``) when it cannot be started.
        """
        argv, shell = run_as.command(argv, shell)
        with self._lock:
            proc = subprocess.Popen(
                argv,
                shell=shell,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
                close_fds=True,
                **run_as.popen_kwargs(),
            )
            self._popens[proc.pid] = proc
        return proc

    def run(
        self,
        argv: Sequence[str] | str,
        run_as: RunAs,
        *,
        shell: bool = False,
        timeout: float,
        input: bytes | None = None,
        max_output: int = MAX_OUTPUT_BYTES,
    ) -> subprocess.CompletedProcess:
        """Run to completion, capturing stdout and stderr (bytes, ``max_output`` together).

        Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the process group is
        killed first; its ``output``/``stderr`` hold what was read so far),
        :class:`OutputTooLarge` when it writes more than ``max_output`` bytes (killed the same
        way) and ``OSError`` when the program cannot be started. A process of another session
        (``setsid``) holding the pipes open keeps the answer waiting no longer than
        :data:`KILLED_DRAIN_S` past the timeout: its pipes are left to it.
        """
        proc = self.spawn(
            argv,
            run_as,
            shell=shell,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = _communicate(proc, input, timeout, max_output)
        finally:
            self.reap()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def reap(self) -> list[int]:
        """Collect finished children: ``Popen.poll()`` for ours, ``waitpid`` for orphans.

        Returns the pids reaped by ``waitpid`` (re-parented orphans).
        """
        reaped: list[int] = []
        with self._lock:
            for pid, proc in list(self._popens.items()):
                if proc.poll() is not None:
                    del self._popens[pid]
            me = os.getpid()
            # its children only: the reaper runs every second, and a desktop holding thousands
            # of processes (a fork bomb at its pids cap) made each whole-tree walk cost ~0.1 s
            for info in own_process_table(me, depth=1).values():
                if info.ppid == me and info.state == "Z" and info.pid not in self._popens:
                    try:
                        os.waitpid(info.pid, os.WNOHANG)
                        reaped.append(info.pid)
                    except ChildProcessError:
                        pass
        return reaped

    def kill(self, select, *, timeout: float = 3.0, read_table=None) -> set[int]:
        """Kill every process ``select(table)`` returns, again and again until none is left.

        ``select`` maps a fresh :func:`own_process_table` (this process's subtree; read by
        ``read_table`` when given, e.g. ``Session.process_table``) to the pids to kill
        (re-evaluated each round, so children forked meanwhile and orphans re-parented to us
        are caught).
        Returns the pids that were killed. Raises ``RuntimeError`` naming the survivors
        when some are still alive (or unreaped) after ``timeout`` seconds.
        """
        read_table = read_table or own_process_table
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            table = read_table()
            pids = set(select(table))
            if not pids:
                return killed
            live = [pid for pid in pids if not ended(table[pid])]
            _send(live, signal.SIGSTOP)
            _send(live, signal.SIGKILL)
            killed.update(pids)
            time.sleep(0.003)
            self.reap()
            if time.monotonic() > deadline:
                table = read_table()
                left = sorted(set(select(table)))
                if left:
                    names = ", ".join(
                        f"{pid} ({table[pid].comm}, {table[pid].state})"
                        for pid in left
                        if pid in table
                    )
                    raise RuntimeError(
                        f"processes survived the kill after {timeout:.1f} s: {names}"
                    )
                return killed


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _communicate(
    proc: subprocess.Popen, input: bytes | None, timeout: float, limit: int
) -> tuple[bytes, bytes]:
    """``proc.communicate(input, timeout)`` that holds at most ``limit`` bytes of stdout and
    stderr together: past it the group is killed and :class:`OutputTooLarge` raised; at the
    timeout it is killed and ``subprocess.TimeoutExpired`` raised with what was read, after
    :data:`KILLED_DRAIN_S` for what it wrote last (a process of another session holding the
    pipes keeps them open: they are closed here, under it). One thread, ``selectors`` over
    the pipes' descriptors, as the standard library's own ``communicate``."""
    chunks: dict[int, list[bytes]] = {}
    total = 0
    pending = memoryview(input) if input is not None else None
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                os.set_blocking(stream.fileno(), False)
                selector.register(stream.fileno(), selectors.EVENT_READ)
                chunks[stream.fileno()] = []
        if proc.stdin is not None:
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        out_fd = proc.stdout.fileno() if proc.stdout is not None else -1
        err_fd = proc.stderr.fileno() if proc.stderr is not None else -1

        def read(until: float) -> bool:
            """Read until every pipe is closed (True) or ``until`` passes (False)."""
            nonlocal total, pending
            while selector.get_map():
                left = until - time.monotonic()
                if left <= 0:
                    return False
                for key, events in selector.select(left):
                    fd = key.fd
                    if events & selectors.EVENT_WRITE:
                        try:
                            pending = pending[os.write(fd, pending[:65536]) :]
                        except BrokenPipeError:
                            pending = None
                        if not pending:
                            selector.unregister(fd)
                            proc.stdin.close()
                        continue
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        selector.unregister(fd)
                        continue
                    total += len(data)
                    if total > limit:
                        return True
                    chunks[fd].append(data)
            return True

        def stop() -> None:
            _signal_group(proc.pid, signal.SIGKILL)
            read(time.monotonic() + KILLED_DRAIN_S)
            try:
                proc.wait(KILLED_DRAIN_S)
            except subprocess.TimeoutExpired:
                pass

        deadline = time.monotonic() + timeout
        closed = read(deadline)
        if total > limit:
            first = chunks.get(out_fd) or [b""]
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(KILLED_DRAIN_S)
            except subprocess.TimeoutExpired:
                pass
            raise OutputTooLarge(proc.args, limit, first[0][:65536])
        if not closed:
            stop()
            for stream in (proc.stdout, proc.stderr):  # another session may hold them: let go
                if stream is not None:
                    stream.close()
            out, err = b"".join(chunks.get(out_fd, [])), b"".join(chunks.get(err_fd, []))
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err)
    out, err = b"".join(chunks.get(out_fd, [])), b"".join(chunks.get(err_fd, []))
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # it closed its pipes but runs on
        _signal_group(proc.pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
    return out, err


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
