"""Desktop servers forked from one preloaded template process instead of spawned one by one.

A desktop server spends ~0.45 s of CPU importing its modules (numpy, starlette, uvicorn, Xlib,
mss, PIL...) before it starts its desktop; a batch of the local suite starts 4 of them on 2
cores at once. Instead, the batch's first :class:`.backend.ServerProcess` starts a *template*
(``python -m legato_pipelines.desktops.server.template``) that imports the server once
and then forks every server of the batch: a few milliseconds of CPU each. The same idea as the
osworld worker template (``osworld_worker/template.py``, ``osworld_worker/worker.py`` op ``fork``).

Protocol (JSON lines; requests on the template's stdin, answers on its stdout)::

    template -> {"ready": true, "pid": P, "import_s": s}      once, after the imports
    client   -> {"id": N, "socket": PATH, "argv": [...], "env": {...}}
    template -> {"id": N, "pid": CHILD}  |  {"id": N, "error": "..."}

The child of a fork: starts its own session (``os.setsid``); gets SIGTERM when the template
dies (``PR_SET_PDEATHSIG``; the template's own ``setpriv --pdeathsig TERM`` ties it to the
collector: a dead collector takes template and servers down, and the servers shut their
desktops down); default signal handlers; the template's protocol descriptors closed; stdin
``/dev/null``; its stdout is a connection to the Unix socket ``PATH`` (where the client
listens and sends :data:`GO` once it watches the child; the server prints its
``LEGATO_DESKTOP_READY`` line there); its stderr stays the template's (the collector's, as
a spawned server's); ``os.environ`` becomes ``env`` (the
server's token variable included); ``random`` reseeded; then the server's ``main(argv)`` and
``os._exit`` whatever happens. The client watches it through a pidfd
(:class:`~legato_pipelines.desktops.processes.PidfdProcess`): it is the template's child.

Rules:

- The template is single-threaded (``OPENBLAS_NUM_THREADS=1``, ``OMP_NUM_THREADS=1``, no
  event loop, nothing that starts a thread): a fork copies only the forking thread, and a lock
  another thread held at the fork would stay held in every child. It refuses to serve (and
  the servers are spawned) when it finds a second thread after its imports.
- The template outlives its servers: its children die with it (the parent-death signal).
  It is shared by the servers of one interpreter on one event loop (the runners' and the
  late spares' desktops are opened by separate calls) and counted by lease: a server takes
  one in ``start()`` (:func:`acquire_server_template`) and gives it back in ``stop()``, once
  its process has ended (:func:`release_server_template`); the last one stops the template
  (EOF on its stdin). It reaps its children with a SIGCHLD handler (not ``SIG_IGN``).
- Secrets: the template's own environment is ``desktop_server_env()`` (no policy key, no
  credential); each child's is the one its request carries (the same, plus its own token),
  never the collector's. ``/proc/<child>/environ`` shows the template's start environment
  (a fork does not exec): no token, no policy key.
- Whatever fails (the template does not start, died, or a fork fails), the server is spawned
  as before, with a warning (``ServerProcess.start``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time

from ...errors import DesktopError
from ..child_env import SINGLE_THREADED, desktop_server_env
from ..processes import AdoptedProcess, LoopShared, Spawned, pdeathsig_guard, take_early
from ..reaping import reap_children

TEMPLATE_START_TIMEOUT_S = 60.0  # the imports under a loaded machine
TEMPLATE_STOP_GRACE_S = 5.0
#: What a running server imports beyond ``server``'s module: uvicorn's protocol and lifespan
#: (chosen in ``uvicorn.Config.load``), what the display connection loads (Xlib's
#: extensions, mss's backend), Pillow (the observations' PNG, imported where it is made) and
#: what a reset pulls in. Imported by the template when present (listed from a forked
#: server's ``sys.modules`` after a reset, an action and an observation per kind of task:
#: ~0.2 s of CPU per server at its first observation otherwise).
RUN_TIME_MODULES = (
    "uvicorn",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.loops.auto",
    "Xlib.display",
    "Xlib.support.unix_connect",
    "Xlib.xauth",
    "Xlib.ext.composite",
    "Xlib.ext.randr",
    "Xlib.ext.record",
    "Xlib.ext.screensaver",
    "Xlib.ext.security",
    "Xlib.ext.shape",
    "Xlib.ext.xinerama",
    "Xlib.ext.xinput",
    "mss.linux",
    "mss.linux.xshmgetimage",
    "PIL.Image",
    "PIL.ImageChops",
    "PIL.ImageSequence",
    "PIL.PngImagePlugin",
    "fractions",
    "legato_pipelines.desktops.server.mime_defaults",
    "csv",
    "ctypes.util",
    "importlib.metadata",
)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: The byte the client sends on the child's connection once it watches the child: only then
#: does the child run the server (a child whose client gave up sees EOF instead and exits).
GO = b"G"
log = logging.getLogger(__name__)


# -- the client side (the collector) -----------------------------------------------------------


class ServerTemplate:
    """The template process of interpreter ``python`` on one event loop: started by the first
    :meth:`ready`, asked for children by :meth:`fork`, stopped by :meth:`close`. ``users``:
    the leases held on it (:func:`acquire_server_template`)."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self.users = 0
        self.pid: int | None = None
        self.failed = False  # it could not start: not retried
        self._proc: asyncio.subprocess.Process | None = None
        self._start_lock = asyncio.Lock()
        self._call_lock = asyncio.Lock()
        self._next_id = 0

    def alive(self) -> bool:
        """Whether fork requests can go to the template (it runs, its stdout is open)."""
        proc = self._proc
        return proc is not None and proc.returncode is None and not proc.stdout.at_eof()

    async def ready(self) -> bool:
        """Whether the template runs with the server imported: started now by the first
        caller (concurrent callers wait for it). ``False`` when it could not start (a warning
        is logged once; the caller spawns its server). A template that died later counts as
        ready: the fork from it fails and the caller spawns."""
        async with self._start_lock:
            if self._proc is not None or self.failed:
                return not self.failed
            argv, env = template_command(self.python)
            try:
                early = take_early(argv, env)  # started on legato's first line
                if early is not None:
                    self._proc = await AdoptedProcess.adopt(early.popen)
                else:
                    self._proc = await asyncio.create_subprocess_exec(
                        *argv,
                        env=env,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        start_new_session=True,
                    )
                line = await asyncio.wait_for(
                    self._proc.stdout.readline(), TEMPLATE_START_TIMEOUT_S
                )
                hello = json.loads(line) if line else {}
                if not isinstance(hello, dict):  # something printed before the hello
                    hello = {"error": f"an unexpected first line {line[:80]!r}"}
                if not hello.get("ready"):
                    raise DesktopError(hello.get("error") or "it exited at start")
                self.pid = int(hello["pid"])
            except (OSError, ValueError, TimeoutError, DesktopError) as exc:
                log.warning(
                    "the desktop server template did not start (%s: %s); spawning each server",
                    type(exc).__name__,
                    exc,
                )
                self.failed = True
                await self.close()
                return False
            except BaseException:  # cancelled: the next caller starts it again
                await self.close()
                raise
            return True

    async def fork(self, *, socket: str, argv: list[str], env: dict[str, str]) -> int:
        """A child of the template that connects to the Unix socket ``socket`` and runs the
        server's ``main(argv)`` with ``env`` as its whole environment; its pid. Raises
        ``DesktopError(kind="transport")`` when the template is not running or refuses.
        Cancel-safe: a late answer to a cancelled request is skipped by the next one (and
        its child, finding nobody listening, exits)."""
        async with self._call_lock:
            if not self.alive():
                raise DesktopError("the desktop server template is not running", kind="transport")
            proc = self._proc
            self._next_id += 1
            rid = self._next_id
            request = {"id": rid, "socket": socket, "argv": argv, "env": env}
            try:
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                await proc.stdin.drain()
                while True:
                    raw = await asyncio.wait_for(proc.stdout.readline(), 30.0)
                    if not raw:
                        raise DesktopError("the desktop server template exited", kind="transport")
                    answer = json.loads(raw)
                    if answer.get("id") == rid:
                        break
            except (ConnectionError, TimeoutError, ValueError) as exc:
                raise DesktopError(
                    f"the desktop server template failed: {type(exc).__name__}: {exc}",
                    kind="transport",
                ) from None
            if "pid" not in answer:
                raise DesktopError(
                    f"the desktop server template refused: {answer.get('error')}",
                    kind="transport",
                )
            return int(answer["pid"])

    async def close(self) -> None:
        """Stop the template: EOF on its stdin (it exits; its children, if any were left,
        get SIGTERM), SIGKILL after :data:`TEMPLATE_STOP_GRACE_S`; SIGKILL at once while it
        has not said hello (still importing, no child yet: a batch whose policy check failed
        does not wait for the imports)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        spawned = Spawned(proc)
        if not spawned.exited:
            if self.pid is None:
                spawned.kill()
            proc.stdin.close()
            try:
                await asyncio.wait_for(spawned.wait(), TEMPLATE_STOP_GRACE_S)
            except TimeoutError:
                spawned.kill()
                await spawned.wait()


def template_command(python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The template process's command line (``python -m`` this module; under ``setpriv
    --pdeathsig TERM`` where there is one: it ends with the collector) and whole environment
    (this process's without the policy key or any credential, one BLAS thread). Used by
    :meth:`ServerTemplate.ready` and by ``desktops/early.py``, which starts it on ``legato``'s
    first line."""
    env = {**desktop_server_env(), **SINGLE_THREADED}  # never the policy key
    guard = pdeathsig_guard()
    return [*guard, python, "-m", __name__], env


#: interpreter -> its server template, per event loop (asyncio objects belong to one loop)
_templates = LoopShared(ServerTemplate)


def acquire_server_template(python: str = sys.executable) -> ServerTemplate:
    """A lease on the server template of ``python`` on the running event loop (created, not
    started, by the first lease). Must be called from a coroutine; pair with
    :func:`release_server_template` once the server forked from it has ended."""
    return _templates.acquire(python)


async def release_server_template(template: ServerTemplate) -> None:
    """End one lease; the last one stops the template (a later lease starts a new one)."""
    await _templates.release(template, template.python)


def server_template_started(python: str = sys.executable) -> contextlib.AbstractAsyncContextManager:
    """Hold a lease on the server template of ``python`` for the block and start it now, in
    the background (:meth:`.LoopShared.started`): servers that start inside the block fork
    from it, or wait for the start under way."""
    return _templates.started(python)


# -- the template process ----------------------------------------------------------------------


def _set_pdeathsig(signum: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _forked_child(req: dict, template_pid: int, protocol_fd: int) -> None:
    """The child of a fork request (module docstring); never returns."""
    code = 1
    try:
        os.setsid()
        _set_pdeathsig(signal.SIGTERM)
        if os.getppid() != template_pid:  # the template died before the prctl
            os._exit(1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.close(protocol_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(req["socket"])
                go = sock.recv(1)
            except OSError:
                go = b""
            if go != GO:  # the client gave up (cancelled): nobody waits for this server
                os._exit(1)
            os.dup2(sock.fileno(), 1)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in req["env"].items()})
        import random

        random.seed()
        from . import main

        main.main([str(a) for a in req["argv"]])
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc(file=sys.stderr)
    finally:
        try:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _fork(req: dict, protocol_fd: int) -> int:
    if not isinstance(req.get("env"), dict) or not isinstance(req.get("argv"), list):
        raise ValueError("a fork needs argv (a list) and env (a dict)")
    if not req.get("socket"):
        raise ValueError("a fork needs socket")
    sys.stdout.flush()
    sys.stderr.flush()
    template_pid = os.getpid()
    # the imported modules' objects out of the cyclic collector's reach: a child's full
    # collection would otherwise write to every one of them (copying the template's heap
    # page by page: ~55 ms of CPU at a server's start, more at each later full collection)
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        _forked_child(req, template_pid, protocol_fd)  # never returns
    return pid


def main() -> None:
    """The template process: import the server, say ready, answer fork requests until EOF."""
    for name, value in SINGLE_THREADED.items():
        os.environ.setdefault(name, value)
    t0 = time.perf_counter()
    import importlib
    import threading

    from . import main  # noqa: F401

    for name in RUN_TIME_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    with contextlib.suppress(ImportError):
        from PIL import Image

        Image.preinit()  # its image plugins, imported at a first save otherwise
    out = os.fdopen(os.dup(1), "wb")  # the protocol; anything printed goes to stderr
    os.dup2(2, 1)
    hello: dict = {"ready": True, "pid": os.getpid(), "import_s": time.perf_counter() - t0}
    threads = len(os.listdir("/proc/self/task"))
    if threading.active_count() > 1 or threads > 1:
        hello = {"ready": False, "error": f"{threads} threads after the imports (one allowed)"}
    out.write(json.dumps(hello).encode() + b"\n")
    out.flush()
    if not hello["ready"]:
        return
    signal.signal(signal.SIGCHLD, reap_children)  # before any fork: a child may end at once
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        rid = None
        try:
            req = json.loads(line)
            rid = req.get("id")
            answer = {"id": rid, "pid": _fork(req, out.fileno())}
        except Exception as exc:
            answer = {"id": rid, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()
    # EOF: the client is done with us. Nothing to finalize (the children are on their own),
    # and tearing down the imported modules costs ~0.13 s the client waits for at its exit.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
