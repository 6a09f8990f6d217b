"""The ``osworld`` backend's channel to its worker: one subprocess per desktop, JSON lines.

The worker (``worker.py``) runs under the OSWorld interpreter; this side is asyncio only:
every request has a deadline; a worker that misses one is stopped (SIGTERM: it closes its VM;
SIGKILL after a grace period) and the call raises
:class:`~legato_pipelines.errors.DesktopError`.

A worker is either spawned (``<python> -I worker.py``, its protocol on stdin/stdout) or forked
from a *template*, a running worker that imported desktop_env (op ``preload``) and answers op
``fork``: the child speaks the same protocol on a Unix socket and has desktop_env imported
already, for a few milliseconds of CPU instead of the import's ~1.2 s (issue 18). The child is
the template's child, not ours: it is watched through a pidfd and its exit code is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...errors import ConfigError, DesktopError
from ..processes import AdoptedProcess, ForkRendezvous, PidfdProcess, Spawned, pdeathsig_guard
from .confine import GRADER_GID, GRADER_UID

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
PROTOCOL_LINE_LIMIT = 64 * 2**20  # bytes: a base64 screenshot fits on one line
STOP_GRACE_S = 30.0  # a worker closing a docker VM needs a while
FORK_TIMEOUT_S = 30.0  # the template's answer to fork, then the child's hello (a loaded machine)
#: passt's ``pasta`` (Debian package ``passt``): connects a confined worker's network namespace
#: to its desktop's host ports (:meth:`WorkerProcess.forward`)
PASTA = "pasta"
FORWARD_TIMEOUT_S = 10.0  # until pasta listens in the worker's namespace
#: What a missed deadline counts as, per request.
DEADLINE_KIND = {
    "start": "vm",
    "reset": "setup",
    "setup": "setup",
    "observe": "vm",
    "step": "vm",
    "evaluate": "evaluator",
    "close": "vm",
    "plan": "transport",
    "fork": "transport",
    "warm": "transport",
}
log = logging.getLogger(__name__)


class _Spawned(Spawned):
    """A worker we spawned; ``stdin``/``stdout``: its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process):
        super().__init__(proc)
        self.stdin, self.stdout = proc.stdin, proc.stdout


class _Forked(PidfdProcess):
    """A worker forked from a template (:class:`~legato_pipelines.desktops.processes.PidfdProcess`:
    not our child, exit code unknown). ``stdin``/``stdout``: the socket's writer/reader, closed
    once the process has ended."""

    def __init__(self, pid: int, pidfd: int, reader, writer):
        super().__init__(pid, pidfd)
        self.stdin, self.stdout = writer, reader

    def _closed(self) -> None:
        super()._closed()
        self.stdin.close()


def confinement(writable: Sequence[str] = ()) -> dict[str, Any]:
    """The ``confine`` of a worker that reads a desktop's data (``WorkerProcess(confine=)``,
    ``confine.py``): the grader user; writable: its working directory and ``writable``.
    Raises ``DesktopError`` (kind ``transport``) when this process is not root: only root
    makes the namespaces and changes the user (local desktops need root anyway,
    docs/sandbox.md §5)."""
    if os.geteuid() != 0:
        raise DesktopError(
            "an OSWorld worker grading a local desktop runs confined (namespaces and a user of "
            "its own), which needs root: run the collector as root, as local desktops need",
            kind="transport",
        )
    network = "own" if shutil.which(PASTA) else "host"
    if network == "host" and not _warned_no_pasta:
        _warned_no_pasta.append(True)
        log.warning(
            "pasta is missing: confined OSWorld workers keep the host's network, every host "
            "loopback service in reach (fix: apt-get install passt)"
        )
    return {
        "uid": GRADER_UID,
        "gid": GRADER_GID,
        "writable": [str(p) for p in writable],
        "network": network,
    }


_warned_no_pasta: list[bool] = []


def desktop_ports(url: str, ports: Mapping[str, int] | None = None) -> list[int]:
    """The host loopback TCP ports a worker attached to the local desktop server at ``url``
    talks to: the server's, Chromium's CDP bridge (``ports["chromium"]``, else 9222) and
    VLC's (``ports["vlc"]``, else 8080): ``provider_local.LocalProvider``'s ports, as
    DesktopEnv's getters use them."""
    ports = ports or {}
    port = urlsplit(url).port
    if port is None:
        raise DesktopError(f"the desktop server's URL {url!r} names no port", kind="transport")
    return sorted({port, int(ports.get("chromium", 9222)), int(ports.get("vlc", 8080))})


def listening_ports(pid: int) -> set[int]:
    """TCP ports listened on (IPv4) in the network namespace of process ``pid``."""
    try:
        with open(f"/proc/{pid}/net/tcp") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return set()
    return {int(f[1].rsplit(":", 1)[1], 16) for f in map(str.split, lines) if f[3] == "0A"}


def _exit_text(code: int | None) -> str:
    """``exited (code)``, or ``exited`` for a forked worker, whose code nobody here knows."""
    return "exited" if code is None else f"exited ({code})"


class WorkerProcess:
    """One worker subprocess and its JSON-lines channel.

    ``python``: the OSWorld interpreter; ``env``: the worker's whole environment; ``cwd``: its
    working directory. :meth:`call` sends one request and waits at most ``timeout`` seconds.
    ``template``: a started worker that ran ``preload``; :meth:`start` then forks the worker
    from it (module docstring) and spawns one only when that fails. ``forked``: whether the
    running worker came from the template. ``confine``: ``{uid, gid, writable}`` for a worker
    that reads a desktop's data (``confine.py``: it runs in namespaces of its own as user
    ``uid``, writing only ``cwd`` and the ``writable`` paths), forked or spawned alike;
    ``None``: as this process's user (a VM provider's worker, which needs its credentials).
    """

    def __init__(
        self,
        python: str,
        *,
        env: dict[str, str],
        cwd: str,
        name: str = "osworld",
        log_path: str | None = None,
        template: WorkerProcess | None = None,
        confine: dict[str, Any] | None = None,
    ):
        self.python, self.env, self.cwd, self.name = python, env, cwd, name
        self.confine = confine
        self.log_path, self.template = log_path, template
        self.forked = False
        self._proc: _Spawned | _Forked | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._broken = False  # a call was cancelled mid-way: the channel is out of step
        self._pasta: subprocess.Popen | None = None  # :meth:`forward`'s

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        """Whether calls can go to the worker: it runs, its channel has not hit EOF and no
        cancelled call left it out of step."""
        proc = self._proc
        return (
            proc is not None and not proc.exited and not proc.stdout.at_eof() and not self._broken
        )

    async def start(self) -> None:
        """Fork the worker from ``template`` when there is one, else (or when the template is
        not running or the fork fails: a warning) spawn it (``<python> -I worker.py``;
        isolated mode: no user site, no PYTHON* env).

        Its stderr (DesktopEnv's logging and prints) is appended to ``log_path`` when given
        (a forked worker's to ``<cwd>/worker.log`` without one). Raises ``ConfigError`` when
        the interpreter cannot be run.
        """
        os.makedirs(self.cwd, exist_ok=True)
        self.forked = False
        if self.template is not None:
            try:
                self._proc = await self._fork()
                self.forked = True
                return
            except DesktopError as exc:
                log.warning(
                    "%s: no worker forked from the template (%s); spawning one", self.name, exc
                )
        self._proc = _Spawned(await self._spawn())

    async def adopt(self, popen) -> None:
        """Take over ``popen``, this worker's process spawned before the event loop ran
        (``subprocess.Popen`` with stdin and stdout pipes: ``desktops/early.py``), instead of
        :meth:`start`."""
        self.forked = False
        self._proc = _Spawned(await AdoptedProcess.adopt(popen, limit=PROTOCOL_LINE_LIMIT))

    async def _fork(self) -> _Forked:
        """The worker, forked from ``template`` (op ``fork``) and connected to a Unix socket in
        a private directory. Raises ``DesktopError`` (kind ``transport``) when the template is
        not running, refuses, or the child does not say hello within :data:`FORK_TIMEOUT_S`."""
        template = self.template
        if not template.alive():
            raise DesktopError(f"{self.name}: the template worker is not running", kind="transport")
        try:
            async with ForkRendezvous("legato-fork-") as meeting:
                answer = await template.call(
                    "fork",
                    FORK_TIMEOUT_S,
                    socket=meeting.path,
                    env=self.env,
                    cwd=os.path.abspath(self.cwd),
                    log_path=os.path.abspath(self.log_path or os.path.join(self.cwd, "worker.log")),
                    **({"confine": self.confine} if self.confine else {}),
                )
                pid = int(answer["pid"])
                conn = await meeting.accept(pid, FORK_TIMEOUT_S, f"{self.name}: the forked worker")
                writer = None
                try:
                    reader, writer = await asyncio.open_unix_connection(
                        sock=conn, limit=PROTOCOL_LINE_LIMIT
                    )
                    hello = await asyncio.wait_for(reader.readline(), FORK_TIMEOUT_S)
                    said = json.loads(hello).get("pid") if hello else None
                    if said != pid:
                        raise DesktopError(
                            f"{self.name}: the forked worker said hello as {said!r}, not {pid}",
                            kind="transport",
                        )
                except BaseException:  # its connection too (no or bad hello)
                    (writer or conn).close()
                    raise
                return _Forked(pid, meeting.adopt(), reader, writer)
        except (TimeoutError, OSError, ValueError) as exc:
            raise DesktopError(
                f"{self.name}: forking from the template failed: {type(exc).__name__}: {exc}",
                kind="transport",
            ) from None

    async def _spawn(self) -> asyncio.subprocess.Process:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            confine = ["--confine", json.dumps(self.confine)] if self.confine else []
            return await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                str(WORKER_SCRIPT),
                *confine,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                stderr=log,
                limit=PROTOCOL_LINE_LIMIT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot run the OSWorld interpreter {self.python!r}: {exc} "
                "(fix: legato osworld install, or --osworld-python PATH)"
            ) from None
        finally:
            if log is not None:
                log.close()  # the child has its own descriptor

    async def call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send ``{op, **fields}``; return the worker's ``result``.

        Raises ``DesktopError`` with the worker's failure kind, with kind ``transport`` when the
        worker is gone, or with the op's kind (:data:`DEADLINE_KIND`) when ``timeout`` seconds
        pass (the worker is stopped then: it may be stuck in one of DesktopEnv's sleeps).
        """
        async with self._lock:
            if not self.alive():
                raise DesktopError(
                    f"{self.name}: the OSWorld worker is not running", kind="transport"
                )
            proc = self._proc  # stop() may run meanwhile and drop self._proc
            self._next_id += 1
            rid = self._next_id
            line = json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n"
            try:
                proc.stdin.write(line)
                await proc.stdin.drain()
                raw = await asyncio.wait_for(proc.stdout.readline(), timeout)
            except asyncio.CancelledError:
                # the caller gave up (e.g. the engine's own eval deadline): the answer would
                # arrive for the next request, so this worker is done; stop() reaps it
                self._broken = True
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                    proc.send_signal(signal.SIGCONT)
                raise
            except TimeoutError:
                await self.stop(grace=5.0)
                raise DesktopError(
                    f"{self.name}: OSWorld worker {op} gave no answer within {timeout:g} s (worker stopped)",
                    kind=DEADLINE_KIND.get(op, "vm"),
                ) from None
            except (ConnectionError, BrokenPipeError, ValueError) as exc:
                raise DesktopError(
                    f"{self.name}: OSWorld worker channel broke during {op}: {exc}",
                    kind="transport",
                ) from None
            if not raw:
                code = await proc.wait()
                raise DesktopError(
                    f"{self.name}: the OSWorld worker {_exit_text(code)} during {op} (log: {self.log_path or 'stderr'})",
                    kind="transport",
                )
            answer = json.loads(raw)
            if answer.get("id") != rid:
                await self.stop(grace=5.0)
                raise DesktopError(
                    f"{self.name}: OSWorld worker answered request {answer.get('id')} to {rid}",
                    kind="transport",
                )
            if not answer.get("ok"):
                error = answer.get("error") or {}
                kind = error.get("kind") or "vm"
                raise DesktopError(
                    f"{self.name}: {op}: {error.get('message', 'failed')}",
                    kind="transport" if kind == "protocol" else kind,
                )
            return answer.get("result") or {}

    async def forward(self, ports: Sequence[int]) -> None:
        """Connect the running worker's network namespace (a confined one's, ``confine``
        network ``own``) to host loopback TCP ``ports`` and nothing else: ``pasta -T`` makes
        a connection to ``127.0.0.1:P`` inside reach ``127.0.0.1:P`` of the host for each
        port; no route out, nothing forwarded in. pasta gets the namespace as a descriptor of
        its own (it drops the capabilities it would need to open another process's). Replaces
        an earlier forward; ends with :meth:`stop`. Does nothing for a worker without a
        network of its own. Raises ``DesktopError`` (kind ``transport``) when pasta exits or
        does not listen on every port within :data:`FORWARD_TIMEOUT_S`."""
        self._stop_pasta()
        if not self.confine or self.confine.get("network") != "own" or self._proc is None:
            return
        pid = self._proc.pid  # a spawned worker: its parent, which shares its namespace
        wanted = {int(p) for p in ports}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FORWARD_TIMEOUT_S
        host = os.stat("/proc/self/ns/net").st_ino
        while os.stat(f"/proc/{pid}/ns/net").st_ino == host:  # a spawned one still starting
            if self._proc.exited or loop.time() > deadline:
                raise DesktopError(
                    f"{self.name}: the worker made no network namespace of its own",
                    kind="transport",
                )
            await asyncio.sleep(0.005)
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            argv = [*pdeathsig_guard(), PASTA, "--foreground", "--quiet", "--runas", "0"]
            argv += ["-t", "none", "-u", "none", "-U", "none", "-T", ",".join(map(str, wanted))]
            self._pasta = subprocess.Popen(
                [*argv, "--netns", f"/proc/self/fd/{fd}"],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        while not wanted <= listening_ports(pid):
            if self._pasta.poll() is not None or loop.time() > deadline:
                ended = self._pasta.poll() is not None
                err = self._pasta.stderr.read().decode(errors="replace")[-300:] if ended else ""
                self._stop_pasta()
                raise DesktopError(
                    f"{self.name}: pasta did not connect the worker to ports {sorted(wanted)}: "
                    f"{err.strip() or ('it exited' if ended else 'no listener in 10 s')}",
                    kind="transport",
                )
            await asyncio.sleep(0.005)

    def _stop_pasta(self) -> None:
        pasta, self._pasta = self._pasta, None
        if pasta is not None:
            if pasta.poll() is None:
                pasta.kill()
            pasta.wait()
            pasta.stderr.close()

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM (the worker closes its DesktopEnv), SIGKILL after ``grace`` seconds; its
        :meth:`forward` ends too."""
        self._stop_pasta()
        proc, self._proc = self._proc, None
        self._broken = False
        if proc is None or proc.exited:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)  # a stopped worker gets to handle the SIGTERM
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()
