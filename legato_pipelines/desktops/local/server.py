"""The local desktop server: one process per desktop, OSWorld's in-VM API plus ``/legato/``.

Run it as ``python -m legato_pipelines.desktops.local.server --port P`` (or ``legato desktop
serve``). It owns its Xvfb display, openbox, the desktop user's HOME baseline and the task's
processes (as their subreaper), and serves:

OSWorld's base routes (request/response shapes of ``desktop_env/server/main.py``)
  GET  /screenshot                   PNG (with the cursor)
  POST /execute, /setup/execute      {command, shell[, timeout]} -> {status, output, error, returncode}
  POST /setup/launch                 {command, shell} -> text; does not wait
  POST /setup/open_file              {path[, timeout]} -> text once a window titled with the file's name shows
  POST /setup/activate_window        {window_name, strict, by_class} (wmctrl -a semantics; 404: no match)
  POST /setup/close_window           {window_name, strict, by_class} (wmctrl -c semantics; 404: no match)
  POST /setup/upload                 multipart file_path + file_data -> text (parents created)
  POST /file                         form/JSON file_path -> bytes, 404 when missing
  GET  /platform -> "Linux";  POST|GET /screen_size -> {width, height};  GET /cursor_position -> [x, y]
  GET  /terminal -> {output: null, status}  (liveness);  GET /accessibility -> {AT: xml} (windows only)
  POST /desktop_path -> {desktop_path}

Project routes
  POST /legato/act       an Action as JSON -> XTest input; {act_s}
  POST /legato/wait      {mode: action|launch|reset|eval, stable_s?, timeout_s?, interval_s?} -> {ready_s, ...}
  GET|POST /legato/observe   PNG; headers X-Screen-Width, X-Screen-Height
  POST /legato/reset     {full: bool} -> {kind: fast|full, reset_s, ...}
  GET  /legato/health    {ok, display, user, home, width, height, pid, generation}
  GET  /legato/processes {server_pid, task: [{pid, comm, state}], infra: [...]}

Every request needs the desktop's token (``Authorization: Bearer <token>`` or
``X-Legato-Token``); it is read from an environment variable (``--token-env``), never argv.
The server listens on 127.0.0.1 unless told otherwise. Commands run as the desktop user, in
its HOME. This is isolation between desktops and from the collector's files, **not a sandbox
against a hostile policy**: the policy can type into a terminal and run anything the
desktop user may run. Use VMs (the ``osworld`` backend) for that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ...actions import Action
from ...osworld_format.controller import EXECUTE_TIMEOUT_S
from ..ready import HEAVY_APPS, ReadyResult, policy_for, wait_until_ready
from . import apps
from .procs import become_subreaper, process_table
from .session import Session, SessionError
from .wire import DEFAULT_TOKEN_ENV, READY_LINE
from .xthread import XThread

OPEN_FILE_TIMEOUT_S = 60.0
FILE_TIMEOUT_S = 60.0
REAP_INTERVAL_S = 1.0
ACTION_FIELDS = {f.name for f in fields(Action)}
log = logging.getLogger("legato.desktop")


class BadRequest(ValueError):
    """A request field is missing or wrong (answered with 400 and the message)."""


@dataclass
class LaunchMark:
    """What the screen looked like when the last app was launched (for the launch ready wait)."""

    frame: np.ndarray
    windows: frozenset[int]


class DesktopServer:
    """The state behind the routes: the session, its X thread and the pending launch."""

    def __init__(self, session: Session, *, remove_state: bool = False):
        self.session = session
        self.remove_state = remove_state
        self.x = XThread(session)
        self.reset_lock = asyncio.Lock()
        self.launch_mark: LaunchMark | None = None
        self.before_action: np.ndarray | None = None  # the screen just before the last action
        self._reaper: asyncio.Task | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.x.run(self.session.start)
        await self.x.run(self.x.ctx)
        self._reaper = asyncio.create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self.x.run(self.x.drop_ctx)
        await self.x.run(self.session.close)
        self.x.shutdown()
        if self.remove_state:
            shutil.rmtree(self.session.state, ignore_errors=True)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.session.procs.reap)

    # -- helpers --------------------------------------------------------------------------------

    @property
    def home(self) -> str:
        return str(self.session.home)

    async def run_command(
        self, argv, shell: bool, timeout: float, input: bytes | None = None
    ) -> subprocess.CompletedProcess:
        return await asyncio.to_thread(
            self.session.procs.run,
            argv,
            self.session.run_as(),
            shell=shell,
            timeout=timeout,
            input=input,
        )

    def _mark_launch(self) -> None:
        ctx = self.x.ctx()
        self.launch_mark = LaunchMark(ctx.screen.frame(), frozenset(ctx.windows.client_ids()))

    def _spawn_app(self, argv, shell: bool) -> int:
        argv, shell = apps.with_session_bus(argv, shell)
        self._mark_launch()
        with open(self.session.state / "apps.log", "ab") as log:
            proc = self.session.procs.spawn(
                argv, self.session.run_as(), shell=shell, stdout=log, stderr=log
            )
        return proc.pid

    def heavy_app_running(self) -> bool:
        table = process_table()
        return any(
            table[pid].comm in HEAVY_APPS for pid in self.session.task_pids(table) if pid in table
        )

    # -- operations used by several routes ------------------------------------------------------

    async def reset(self, full: bool) -> dict:
        """Fast reset (kill the task's processes, restore HOME), or a full restart when asked,
        when the display died, or when the fast reset failed."""
        async with self.reset_lock:
            t0 = time.perf_counter()
            kind = "full" if full or not self.session.alive() else "fast"
            detail: dict = {}
            if kind == "fast":
                try:
                    detail = await self.x.run(self._fast_reset_sync)
                except Exception as exc:  # fall back to the full restart
                    detail = {"fast_error": str(exc)}
                    kind = "full"
            if kind == "full":
                detail |= await self.x.run(self._full_reset_sync)
            self.launch_mark = self.before_action = None
            return {"kind": kind, "reset_s": time.perf_counter() - t0, **detail}

    def _fast_reset_sync(self) -> dict:
        detail = self.session.fast_reset()
        self._settle_input()
        return detail

    def _full_reset_sync(self) -> dict:
        self.x.drop_ctx()
        detail = self.session.full_reset()
        self._settle_input()
        return detail

    def _settle_input(self) -> None:
        ctx = self.x.ctx()
        ctx.input.release_all()
        width, height = ctx.screen.size
        ctx.input.move(width - 1, height - 1)  # park the pointer where it hovers over nothing
        ctx.display.sync()

    async def wait_ready(self, mode: str, **overrides) -> ReadyResult:
        mark = self.launch_mark if mode in ("launch", "reset") else None
        reference = (
            mark.frame if mark is not None else self.before_action if mode == "action" else None
        )
        heavy = mode in ("launch", "reset") and await asyncio.to_thread(self.heavy_app_running)
        policy = policy_for(mode, heavy=heavy, launch_pending=mark is not None, **overrides)

        async def grab() -> np.ndarray:
            return await self.x.run(lambda: self.x.ctx().screen.frame())

        async def new_window() -> bool:
            ids = await self.x.run(lambda: self.x.ctx().windows.client_ids())
            return bool(set(ids) - mark.windows) if mark is not None else False

        result = await wait_until_ready(grab, policy, reference=reference, new_window=new_window)
        if mark is not None and result.changed:
            self.launch_mark = None
        if mode == "action":
            self.before_action = None
        return result

    def perform(self, action: Action) -> None:
        """Grab the screen (the action wait's reference), then perform ``action`` (X thread)."""
        ctx = self.x.ctx()
        self.before_action = ctx.screen.frame()
        ctx.input.perform(action)


# -- request parsing ------------------------------------------------------------------------------


async def _params(request: Request) -> dict:
    """JSON body, or form fields (OSWorld's client sends both kinds)."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        body = await request.body()
        if not body:
            return {}
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"body is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object")
        return data
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form()
        return dict(form)
    return {}


def _field(params: dict, name: str, kind=str, default=...):
    value = params.get(name, default)
    if value is ...:
        raise BadRequest(f"field {name!r} is required")
    if kind is bool and isinstance(value, str):
        value = value.lower() in ("1", "true", "yes")
    if value is not None and not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise BadRequest(f"field {name!r} must be {names}, got {type(value).__name__}")
    return value


def _error(status: int, message: str, kind: str | None = None) -> JSONResponse:
    body = {"status": "error", "message": message}
    if kind:
        body["kind"] = kind
    return JSONResponse(body, status_code=status)


def parse_action(data: dict) -> Action:
    """An :class:`Action` from its JSON form (the dataclass fields). Raises :class:`BadRequest`."""
    unknown = set(data) - ACTION_FIELDS
    if unknown:
        raise BadRequest(
            f"unknown action field(s) {sorted(unknown)}; allowed: {sorted(ACTION_FIELDS)}"
        )
    if not isinstance(data.get("action"), str):
        raise BadRequest("field 'action' must be an action name string")
    values = dict(data)
    values["keys"] = tuple(values.get("keys") or ())
    values.setdefault("arguments", {})
    try:
        return Action(**values)
    except TypeError as exc:
        raise BadRequest(str(exc)) from None


# -- routes -------------------------------------------------------------------------------------


def build_app(server: DesktopServer, token: str, *, manage_lifecycle: bool = True) -> Starlette:
    """The Starlette app of ``server``, guarded by ``token``.

    ``manage_lifecycle``: start the session on startup and stop it on shutdown.
    """
    s = server

    async def screenshot(request: Request) -> Response:
        png = await s.x.run(lambda: s.x.ctx().screen.png())
        return Response(png, media_type="image/png")

    async def observe(request: Request) -> Response:
        t0 = time.perf_counter()
        png, size = await s.x.run(lambda: (s.x.ctx().screen.png(), s.x.ctx().screen.size))
        headers = {
            "X-Screen-Width": str(size[0]),
            "X-Screen-Height": str(size[1]),
            "X-Observe-S": f"{time.perf_counter() - t0:.6f}",
        }
        return Response(png, media_type="image/png", headers=headers)

    async def execute(request: Request) -> Response:
        p = await _params(request)
        shell = _field(p, "shell", bool, False)
        argv = apps.command_argv(_field(p, "command", (str, list)), shell, s.home)
        timeout = float(_field(p, "timeout", (int, float), EXECUTE_TIMEOUT_S))
        try:
            done = await s.run_command(argv, shell, timeout)
        except subprocess.TimeoutExpired:
            return _error(500, f"Command timed out after {timeout:g} seconds", "timeout")
        except OSError as exc:
            return _error(500, f"cannot run {argv!r}: {exc}")
        return JSONResponse(
            {
                "status": "success",
                "output": done.stdout.decode(errors="replace"),
                "error": done.stderr.decode(errors="replace"),
                "returncode": done.returncode,
            }
        )

    async def launch(request: Request) -> Response:
        p = await _params(request)
        shell = _field(p, "shell", bool, False)
        argv = apps.command_argv(_field(p, "command", (str, list)), shell, s.home)
        try:
            await s.x.run(s._spawn_app, argv, shell)
        except OSError as exc:
            return _error(500, f"cannot launch {argv!r}: {exc}")
        shown = argv if isinstance(argv, str) else " ".join(argv)
        return PlainTextResponse(f"{shown} launched successfully")

    async def open_file(request: Request) -> Response:
        p = await _params(request)
        raw = _field(p, "path")
        timeout = float(_field(p, "timeout", (int, float), OPEN_FILE_TIMEOUT_S))
        path = apps.resolve_path(raw, s.home)
        if os.path.exists(path):
            argv = apps.opener_for(path)
        elif apps.shutil.which(raw):
            argv = [raw]
        else:
            return _error(404, f"File not found: {path}")
        await s.x.run(s._spawn_app, argv, False)
        name = os.path.basename(path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = await s.x.run(lambda: s.x.ctx().windows.find(name))
            if found:
                await s.x.run(lambda wid=found[-1].id: s.x.ctx().windows.activate(wid))
                return PlainTextResponse("File opened successfully")
            await asyncio.sleep(0.05)
        return _error(
            500, f"no window titled with {name!r} appeared within {timeout:g} s", "timeout"
        )

    def window_route(close: bool):
        async def handler(request: Request) -> Response:
            p = await _params(request)
            name = _field(p, "window_name")
            strict = _field(p, "strict", bool, False)
            by_class = _field(p, "by_class", bool, False)

            def act() -> bool:
                wins = s.x.ctx().windows
                found = wins.find(name, strict=strict, by_class=by_class)
                if not found:
                    return False
                if close:
                    wins.close(found[0].id)
                else:
                    wins.activate(found[0].id)
                return True

            if not await s.x.run(act):
                return _error(404, f"no window matches {name!r}")
            return PlainTextResponse(
                "Window closed successfully" if close else "Window activated successfully"
            )

        return handler

    async def upload(request: Request) -> Response:
        form = await request.form()
        path = form.get("file_path")
        data = form.get("file_data")
        if not isinstance(path, str) or data is None:
            return _error(
                400, "multipart fields 'file_path' (text) and 'file_data' (file) are required"
            )
        content = await data.read() if hasattr(data, "read") else str(data).encode()
        target = apps.resolve_path(path, s.home)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        done = await s.run_command(
            ["sh", "-c", script, "sh", target], False, FILE_TIMEOUT_S, input=content
        )
        if done.returncode != 0:
            return _error(
                500, f"cannot write {target}: {done.stderr.decode(errors='replace').strip()}"
            )
        return PlainTextResponse("File uploaded successfully")

    async def file(request: Request) -> Response:
        p = await _params(request)
        target = apps.resolve_path(_field(p, "file_path"), s.home)
        done = await s.run_command(["cat", "--", target], False, FILE_TIMEOUT_S)
        if done.returncode != 0:
            return _error(404, f"File not found: {target}")
        return Response(done.stdout, media_type="application/octet-stream")

    async def platform(request: Request) -> Response:
        return PlainTextResponse("Linux")

    async def screen_size(request: Request) -> Response:
        return JSONResponse({"width": s.session.width, "height": s.session.height})

    async def cursor_position(request: Request) -> Response:
        return JSONResponse(list(await s.x.run(lambda: s.x.ctx().input.pointer())))

    async def terminal(request: Request) -> Response:
        return JSONResponse({"output": None, "status": "success"})

    async def accessibility(request: Request) -> Response:
        return JSONResponse({"AT": await s.x.run(lambda: s.x.ctx().windows.accessibility_xml())})

    async def desktop_path(request: Request) -> Response:
        return JSONResponse({"desktop_path": os.path.join(s.home, "Desktop")})

    async def act(request: Request) -> Response:
        action = parse_action(await _params(request))
        t0 = time.perf_counter()
        if action.action == "wait":
            await asyncio.sleep(min(float(action.seconds or 0.0), 60.0))
        else:
            await s.x.run(s.perform, action)
        return JSONResponse({"act_s": time.perf_counter() - t0})

    async def wait(request: Request) -> Response:
        p = await _params(request)
        mode = _field(p, "mode", str, "action")
        overrides = {k: p.get(k) for k in ("stable_s", "timeout_s", "interval_s")}
        for key, value in overrides.items():
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise BadRequest(f"field {key!r} must be a positive number of seconds")
        try:
            result = await s.wait_ready(mode, **overrides)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return JSONResponse({"mode": mode, **result.to_json()})

    async def reset(request: Request) -> Response:
        p = await _params(request)
        try:
            return JSONResponse(await s.reset(_field(p, "full", bool, False)))
        except SessionError as exc:
            return _error(500, f"reset failed: {exc}", "reset")

    async def health(request: Request) -> Response:
        sess = s.session
        return JSONResponse(
            {
                "ok": sess.alive(),
                "display": sess.display,
                "user": sess.user,
                "home": str(sess.home),
                "width": sess.width,
                "height": sess.height,
                "pid": os.getpid(),
                "generation": sess.generation,
            }
        )

    async def processes(request: Request) -> Response:
        def collect() -> dict:
            table = process_table()
            rows = lambda pids: [  # noqa: E731
                {"pid": pid, "comm": table[pid].comm, "state": table[pid].state}
                for pid in sorted(pids)
                if pid in table
            ]
            return {
                "server_pid": os.getpid(),
                "task": rows(s.session.task_pids(table)),
                "infra": rows(s.session.infra_pids(table)),
            }

        return JSONResponse(await asyncio.to_thread(collect))

    def guarded(endpoint):
        """Errors become JSON answers here: bad input -> 400, anything else -> 500 with ``kind``
        ``crash`` when the display is gone. (Starlette's catch-all handler re-raises, and
        uvicorn then drops the keep-alive connection under the client's next request.)"""

        async def handler(request: Request) -> Response:
            try:
                return await endpoint(request)
            except ValueError as exc:  # BadRequest, InputError, bad commands
                return _error(400, str(exc))
            except Exception as exc:
                log.exception("%s %s failed", request.method, request.url.path)
                kind = "crash" if not s.session.alive() else "server"
                return _error(500, f"{type(exc).__name__}: {exc}", kind)

        return handler

    routes = [
        Route("/screenshot", guarded(screenshot), methods=["GET"]),
        Route("/execute", guarded(execute), methods=["POST"]),
        Route("/setup/execute", guarded(execute), methods=["POST"]),
        Route("/setup/launch", guarded(launch), methods=["POST"]),
        Route("/setup/open_file", guarded(open_file), methods=["POST"]),
        Route("/setup/activate_window", guarded(window_route(close=False)), methods=["POST"]),
        Route("/setup/close_window", guarded(window_route(close=True)), methods=["POST"]),
        Route("/setup/upload", guarded(upload), methods=["POST"]),
        Route("/file", guarded(file), methods=["POST"]),
        Route("/platform", guarded(platform), methods=["GET"]),
        Route("/screen_size", guarded(screen_size), methods=["GET", "POST"]),
        Route("/cursor_position", guarded(cursor_position), methods=["GET"]),
        Route("/terminal", guarded(terminal), methods=["GET"]),
        Route("/accessibility", guarded(accessibility), methods=["GET"]),
        Route("/desktop_path", guarded(desktop_path), methods=["POST", "GET"]),
        Route("/legato/act", guarded(act), methods=["POST"]),
        Route("/legato/wait", guarded(wait), methods=["POST"]),
        Route("/legato/observe", guarded(observe), methods=["GET", "POST"]),
        Route("/legato/reset", guarded(reset), methods=["POST"]),
        Route("/legato/health", guarded(health), methods=["GET"]),
        Route("/legato/processes", guarded(processes), methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if manage_lifecycle:
            await s.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await s.stop()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
    )
    return TokenAuth(app, token)


class TokenAuth:
    """ASGI middleware: 401 unless the request carries the desktop's token."""

    def __init__(self, app, token: str):
        if not token:
            raise ValueError("the desktop token is empty")
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"")
            given = (
                auth[7:] if auth[:7].lower() == b"bearer " else headers.get(b"x-legato-token", b"")
            )
            if not given or not hmac.compare_digest(given, self._token):
                body = b'{"status":"error","message":"missing or wrong desktop token (Authorization: Bearer <token>)"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


# -- main --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m legato_pipelines.desktops.local.server",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default loopback only)"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="port (0: any free port; the ready line says which)"
    )
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument(
        "--token-env", default=DEFAULT_TOKEN_ENV, help="environment variable holding the token"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="per-desktop state directory (default: a new temp dir)",
    )
    parser.add_argument(
        "--remove-state",
        action="store_true",
        help="remove --state-dir at exit (a parent that is killed cannot clean it up)",
    )
    parser.add_argument(
        "--user", default="legato-desktop", help="desktop user when started as root"
    )
    parser.add_argument(
        "--template", type=Path, default=None, help="directory copied into the baseline HOME"
    )
    parser.add_argument(
        "--prebuild",
        action="append",
        default=[],
        choices=["libreoffice"],
        help="build this app's profile into the baseline HOME at start (repeatable)",
    )
    parser.add_argument("--log-level", default="warning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Start one desktop and serve it until SIGTERM/SIGINT.

    Prints one line ``LEGATO_DESKTOP_READY {"url", "display", "pid", "home"}`` on stdout once
    the desktop is up and the port accepts connections; everything else goes to stderr.
    """
    import uvicorn

    args = parse_args(argv)
    token = os.environ.pop(args.token_env, "")
    if not token:
        sys.exit(
            f"error: environment variable {args.token_env} (the desktop token) is not set or empty"
        )
    become_subreaper()
    own_state = args.state_dir is None
    state = Path(tempfile.mkdtemp(prefix="legato-desktop-")) if own_state else args.state_dir
    session = Session(
        width=args.width,
        height=args.height,
        state_dir=state,
        user=args.user,
        template=args.template,
        prebuild=tuple(args.prebuild),
    )
    server = DesktopServer(session, remove_state=own_state or args.remove_state)
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so (else Nagle +
    # delayed ACK add ~40 ms to every response).
    sock = socket.socket(
        socket.AF_INET6 if ":" in args.host else socket.AF_INET,
        socket.SOCK_STREAM,
        socket.IPPROTO_TCP,
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        raise SystemExit(
            f"desktop server: cannot listen on {args.host}:{args.port}: {exc.strerror} (fix: another --port)"
        ) from None
    sock.listen(128)
    port = sock.getsockname()[1]

    config = uvicorn.Config(
        build_app(server, token), log_level=args.log_level, access_log=False, lifespan="on"
    )
    uv = uvicorn.Server(config)

    async def serve() -> None:
        startup = uv.startup

        async def announce(sockets=None):
            await startup(sockets=sockets)
            if uv.started:
                host = f"[{args.host}]" if ":" in args.host else args.host
                ready = {
                    "url": f"http://{host}:{port}",
                    "display": session.display,
                    "pid": os.getpid(),
                    "home": str(session.home),
                }
                print(f"{READY_LINE} {json.dumps(ready)}", flush=True)
                os.dup2(2, 1)  # nothing else goes to stdout

        uv.startup = announce
        await uv.serve(sockets=[sock])

    asyncio.run(serve())  # uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown


if __name__ == "__main__":
    main()
