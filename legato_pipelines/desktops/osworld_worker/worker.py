"""The ``osworld`` backend's worker: one OSWorld ``DesktopEnv`` driven over JSON lines.

Runs under the OSWorld interpreter (``legato osworld install``), never the project's: it
imports only the standard library and ``desktop_env`` (and what desktop_env itself depends
on). The backend starts it as ``<osworld-python> -I worker.py`` in an empty working directory
with a clean environment (docs/osworld.md §8: ``dotenv.load_dotenv()`` runs at import and would
read a ``.env`` from the working directory or a folder above the package; it is also turned
off with ``PYTHON_DOTENV_DISABLED=1``).

Protocol: one JSON object per line on stdin, one answer per line on stdout (the real stdout
is kept for the protocol; anything desktop_env prints goes to stderr)::

    -> {"id": 1, "op": "start", "provider": "docker", "screen": [1920, 1080], "cache_dir": "/abs", ...}
    <- {"id": 1, "ok": true, "result": {...}}
    <- {"id": 1, "ok": false, "error": {"kind": "setup|vm|evaluator|transport|protocol", "message": "..."}}

Operations (``result`` shapes):
  plan      the DesktopEnv keyword arguments ``start`` would use (nothing is constructed)
  preload   import desktop_env (its lazy evaluator packages first) before ``start`` is possible,
            e.g. while the desktop it will drive is still starting; {import_s, gc_frozen}
  warm      {evaluators: [task evaluator objects]}: import the metric and getter modules they
            name now (a template, for the workers it forks later); a name that does not import
            is skipped (that task's setup says why); {import_s, names, failed, new_modules,
            modules}
  start     construct DesktopEnv once (boots the VM); {vm, screen:[w,h], import_s, start_s}
  reset     {task_config, fast, domain?, kill?}: fast reset (kill the task's apps, verify, restore the
            baseline HOME) or snapshot revert, then the task's own setup through
            ``DesktopEnv.reset`` (which no longer reverts); {kind: fast|revert, revert_s, clean_s,
            setup_s, setup_failures: [{step, type, exit_status, error}] (setup_facts.py)}
  setup     {task_config}: only the task's setup (``DesktopEnv.reset`` with nothing to revert),
            on a desktop the caller has reset (the local backend's OSWorld grader);
            {setup_s, setup_failures}
  observe   {size?: [w, h], codecs?}: {png: base64}; at the model's size when given (resized
            here, in the worker's process, by the project's ``images.resized_png``, when this
            interpreter's Pillow and imagecodecs are the collector's versions, ``codecs``:
            ``images.png_codecs()``)
  step      {code, pause?}: ``DesktopEnv.step(code, pause)`` (pause 0 unless given);
            {done, info, returncode, error, output} (``output``: the code's stdout tail)
  evaluate  {last_action_fail}: ``DesktopEnv.evaluate()``; {reward, error, notes,
            postconfig_failures}. An exception from the evaluator is a reward 0 with its reason,
            not a failure; ``notes`` are facts about the files the metrics were given
            (``osworld_format/file_notes.py``); ``postconfig_failures`` the postconfig's steps
            OSWorld carries on after, a window step that matched no window included
            (``setup_facts.py``).
  close     ``DesktopEnv.close()`` (stops the VM), then the worker exits.
  fork      {socket, env, cwd, log_path, confine?}: only on a worker whose DesktopEnv is not started
            (typically a "template" that ran ``preload``): ``os.fork()``; the child starts a
            new session, appends its stderr to ``log_path``, changes to ``cwd``, takes ``env``
            as its whole environment, connects to the Unix socket ``socket`` (where the client
            listens), writes ``{"pid": <pid>}`` and serves this protocol there with a new
            worker, never returning to the template's requests; {pid}. The template reaps its
            children (a SIGCHLD handler, so their CPU counts in its RUSAGE_CHILDREN).
            ``confine`` ({uid, gid, writable, network}): the child is pid 1 of a pid
            namespace of its own and confines itself (``confine.py``: mount namespace, user
            ``uid``, no capability; writable: ``cwd`` and ``writable``; ``network`` ``own``:
            a network namespace the collector connects to its desktop's ports) after
            connecting, before it says hello with its host pid.

``worker.py --confine JSON`` (a spawned worker, the same JSON as ``confine``): the worker
forks into a pid namespace of its own and confines itself before reading its first request.
A confined worker cannot see its collector's pid: it ends when its protocol's input hangs up
(:func:`end_with_input`) rather than by the collector's pidfd.

Silent failures of DesktopEnv become errors here (docs/osworld.md §8): a dead server before
reset/step/evaluate (``vm``: probed with a short timeout instead of DesktopEnv's 20 x 5 s
retries), a screenshot of ``None`` (``vm``), a setup that returned False (``setup``), an
action the server never answered (``vm``). Setup steps that raise are ``setup``. The
backend puts a deadline on every request and kills the worker when one passes.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import struct
import sys
import traceback
import types


def as_package(name: str = "legato_osworld") -> str:
    """Make this file's directory the package ``name`` (its ``__init__`` not run: it is the
    project's side) so that the worker's modules load each other by relative import under
    this interpreter, which cannot import the project's package; ``name``."""
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
        sys.modules[name] = package
    return name


def _module(name: str) -> types.ModuleType:
    return importlib.import_module(f"{as_package()}.{name}")


_process = _module("worker_process")
_driver = _module("worker_desktop_env")
_evaluators = _module("worker_evaluators")
# the worker's face (``runpy.run_path(worker.py)``'s names): what ``--names`` and probes use
installed_names = _evaluators.installed_names
install_lazy_evaluators = _evaluators.install_lazy_evaluators
check_evaluator = _evaluators.check_evaluator
WorkerError = _process.WorkerError
describe = _process.describe
end_with_client = _process.end_with_client
end_with_input = _process.end_with_input
model_png = _driver.model_png
_images = _driver._images
#: ``desktops/reaping.py``: the SIGCHLD handler the fork templates share.
_reaping = _process.load_by_path(os.path.join("desktops", "reaping.py"), "legato_reaping")
#: ``desktops/osworld_worker/confine.py``: the namespaces and user a grading worker runs in.
_confine = _process.load_by_path(
    os.path.join("desktops", "osworld_worker", "confine.py"), "legato_confine"
)


class Worker(_driver.EnvWorker):
    """A worker process's :class:`EnvWorker`, which can also fork new workers (op ``fork``:
    a template)."""

    def fork(self, req: dict) -> dict:
        """A new worker forked from this one (op ``fork``, the module docstring). The child
        never returns from here: it serves its socket, then ``os._exit``. Raises
        ``WorkerError("protocol")`` when this worker's DesktopEnv is started or a field is
        missing."""
        if self.env is not None:
            raise WorkerError("protocol", "fork: only a worker without a started DesktopEnv forks")
        missing = [f for f in ("socket", "env", "cwd", "log_path") if not req.get(f)]
        if missing or not isinstance(req["env"], dict):
            raise WorkerError(
                "protocol", f"fork needs socket, env (a dict), cwd and log_path; missing {missing}"
            )
        signal.signal(
            signal.SIGCHLD, _reaping.reap_children
        )  # before the fork: a child may end at once
        threads = len(os.listdir("/proc/self/task"))  # native ones too (BLAS, an import's)
        if threads > 1:  # the child could inherit a lock another thread held
            raise WorkerError(
                "protocol", f"fork: this worker runs {threads} threads; only one may fork"
            )
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # desktop_env's objects: never scanned (and copied) by a child's collections
        confine = req.get("confine")
        if confine:
            if self._pid_namespaces is None:
                self._pid_namespaces = _confine.PidNamespaces()
            self._pid_namespaces.before_fork()
        pid = -1
        try:
            pid = os.fork()
        finally:
            if confine and pid != 0:
                self._pid_namespaces.after_fork()
        if pid == 0:
            _forked_child(req, self.protocol)  # never returns
        return {"pid": pid}


OPS = (
    "plan",
    "preload",
    "warm",
    "start",
    "reset",
    "setup",
    "load_task",
    "observe",
    "step",
    "evaluate",
    "close",
    "fork",
)


def _forked_child(req: dict, protocol: tuple) -> None:
    """The child of op ``fork``: detach from the template (session, descriptors, signals),
    take the request's environment and directory, connect to ``req["socket"]`` and serve a
    new :class:`Worker` there; ``os._exit`` at the end, whatever happens."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # the parent's protocol descriptors: the parent's client sees EOF when the parent
        # ends, not when its last child does (the stream objects stay on the stack, unused)
        for fd in {stream.fileno() for stream in protocol} - {0, 1, 2}:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(req["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(log, 2)
        os.dup2(log, 1)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in req["env"].items()})
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(req["socket"])
        pid = os.getpid()
        confine = req.get("confine")
        if confine:  # pid 1 of its own pid namespace: the collector knows its host pid
            pid = _confine.host_pid()
            confined(confine, req["cwd"])
        out = sock.makefile("wb")
        out.write(json.dumps({"pid": pid}).encode() + b"\n")
        out.flush()
        worker = Worker()
        install_terminate(worker)
        # the collector listens on the socket: its pid is the peer's (SO_PEERCRED: pid, uid,
        # gid; 0 for a confined worker, which sees no pid outside its namespace)
        peer = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        worker.client_pid, worker.client_is_parent = peer[0], False
        serve(sock.makefile("rb"), out, worker)
        code = 0
    except BaseException:
        traceback.print_exc(file=sys.stderr)
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(inp, out, worker: Worker | None = None) -> None:
    """Answer requests from ``inp`` (binary lines) on ``out`` until EOF or ``close``."""
    worker = worker or Worker()
    worker.protocol = (inp, out)
    try:
        for line in inp:
            if not line.strip():
                continue
            rid = None
            try:
                req = json.loads(line)
                rid = req.get("id")
                op = req.get("op")
                if op not in OPS:
                    raise WorkerError("protocol", f"unknown op {op!r}; one of {list(OPS)}")
                answer = {"id": rid, "ok": True, "result": getattr(worker, op)(req)}
            except WorkerError as exc:
                answer = {"id": rid, "ok": False, "error": {"kind": exc.kind, "message": str(exc)}}
            except Exception as exc:  # a bug or an unexpected DesktopEnv failure
                traceback.print_exc(file=sys.stderr)
                answer = {
                    "id": rid,
                    "ok": False,
                    "error": {"kind": "vm", "message": describe(exc)},
                }
            out.write(json.dumps(answer).encode() + b"\n")
            out.flush()
            if answer["ok"] and req.get("op") == "close":
                return
    finally:
        if worker.env is not None:
            try:
                worker.env.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)


def install_terminate(worker: Worker) -> None:
    """SIGTERM (the backend's deadline): stop ``worker``'s VM (``DesktopEnv.close``), then
    exit at once with 128 + the signal.

    Done in the handler rather than by raising: desktop_env has bare ``except:`` clauses (its
    liveness loops) that would swallow a ``SystemExit`` and keep the worker going.
    """

    def terminate(signum, frame):
        try:
            if worker.env is not None:
                worker.env.close()
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def confined(spec: dict, cwd: str, *, spawned: bool = False) -> None:
    """Confine this worker (pid 1 of a pid namespace of its own) by ``spec`` ({uid, gid,
    writable, network}): ``confine.enter`` with ``cwd`` and ``writable`` as its writable
    paths, in a network namespace of its own when ``network`` is ``own`` (a spawned worker's
    was made with its pid namespace: ``confine.spawned_in_pid_namespace``)."""
    writable = [cwd, *(spec.get("writable") or [])]
    own = spec.get("network") == "own" and not spawned
    _confine.enter(writable, uid=int(spec["uid"]), gid=int(spec["gid"]), own_network=own)


def main() -> None:
    """Keep the real stdout for the protocol; everything else printed goes to stderr.

    ``worker.py --names`` prints :func:`installed_names` as one JSON object and exits;
    ``worker.py --preload`` runs op ``preload`` before reading its first request (a template
    started on ``legato``'s first line, ``desktops/early.py``: it imports while the CLI does).
    """
    if sys.argv[1:] == ["--names"]:
        print(json.dumps(installed_names()))
        return
    if sys.argv[1:2] == ["--confine"]:  # before anything reads the collector's pipes
        spec = json.loads(sys.argv[2])
        # the parent waits there, outside, and ends
        _confine.spawned_in_pid_namespace(spec.get("network") == "own")
        confined(spec, os.getcwd(), spawned=True)
        _confine.prctl(_confine.PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    worker = Worker()
    install_terminate(worker)
    import logging

    logging.basicConfig(
        level=os.environ.get("LEGATO_OSWORLD_LOG", "WARNING"),
        stream=sys.stderr,
        format="osworld-worker %(levelname)s %(name)s: %(message)s",
    )
    if sys.argv[1:] == ["--preload"]:  # a template started early: import before the first request
        try:
            worker.preload({})
        except Exception:  # noqa: BLE001 - the first ``preload`` request fails with it again
            pass
    serve(sys.stdin.buffer, out, worker)


if __name__ == "__main__":
    main()
