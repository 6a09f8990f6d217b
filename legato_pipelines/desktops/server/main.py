"""The local desktop server: one process per desktop, OSWorld's in-VM API plus ``/legato/``.

Run it as ``python -m legato_pipelines.desktops.server.main --port P`` (or ``legato desktop
serve``). It owns its Xvfb display, openbox, the desktop user's HOME baseline and the task's
processes (as their subreaper), and serves:

OSWorld's base routes (request/response shapes of ``desktop_env/server/main.py``)
  GET  /screenshot                   PNG (with the cursor)
  POST /execute, /setup/execute      {command, shell[, timeout]} -> {status, output, error, returncode}
  POST /setup/launch                 {command, shell} -> text; 500 {returncode} when it dies at once;
                                     a terminal's or the editor's answer waits for its window (<= 1 s)
  POST /setup/open_file              {path[, timeout]} -> text once a window titled with the file's name shows
  POST /setup/activate_window        {window_name, strict, by_class} (wmctrl -a semantics; 404: no match)
  POST /setup/close_window           {window_name, strict, by_class} (wmctrl -c semantics; 404: no match)
  POST /setup/upload                 multipart file_path + file_data -> text (parents created)
  POST /file                         form/JSON file_path -> bytes, 404 when missing
  GET  /platform -> "Linux";  POST|GET /screen_size -> {width, height};  GET /cursor_position -> [x, y]
  GET  /terminal -> {output: null, status}  (liveness);  GET /accessibility -> {AT: xml} (AT-SPI)
  POST /desktop_path -> {desktop_path}

Project routes
  POST /legato/act       an Action as JSON -> XTest input; {act_s}
  POST /legato/wait      {mode: action|launch|reset|eval|apps, source?: damage|poll, stable_s?, quiet_s?,
                          timeout_s?, interval_s?, tick_s?, app_window_s?} -> {ready_s, source, ...}
  GET|POST /legato/observe   PNG; headers X-Screen-Width, X-Screen-Height
  POST /legato/reset     {full: bool} -> {kind: fast|full, reset_s, ...}; {untouched: true} when
                         nothing but reads came since the start or the last reset (skipped),
                         any other fast one says why it ran: {touched_by: "..."}
  GET  /legato/health    {ok, display, user, home, host_home, sandbox, session_bus, width, height,
                          pid, gc_frozen, generation}
  GET  /legato/processes {server_pid, task: [{pid, comm, state}], infra: [...]}
  GET  /legato/windows   {windows: [{id, title, instance, class, pid, launched}]}
  POST /legato/windows/close {ids: [...]} -> {closed: {id: closed|killed|open|gone}}

Ctrl+Alt+T pressed on the display (XTest included) opens a terminal inside the sandbox, as
GNOME does on OSWorld's VM (``hotkeys.py``); so does a click on an icon of the ``vm`` session's
dock open its app (``dock_channel.py``).

Every request needs the desktop's token (``Authorization: Bearer <token>`` or
``X-Legato-Token``); it is read from an environment variable (``--token-env``), never argv.
The server listens on 127.0.0.1 unless told otherwise. Commands run as the desktop user, in
its HOME, inside the desktop's sandbox (``sandbox.py``: OSWorld's ``user`` and
``/home/user``, sudo with OSWorld's password, the host's files and processes out of sight,
revert in ~0.1 s) unless started with ``--no-sandbox``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...scratch import scratch_dir, sweep
from ..web import WebSettings, chromium_flags, proxy_url
from . import chrome
from . import home as home_mod
from . import recorder as recorder_mod
from .auth import TokenAuth
from .limits import Caps, parse_caps
from .procs import become_subreaper
from .recorder import WebRecorder
from .route_params import error_response
from .routes_legato import LEGATO_ROUTES
from .routes_osworld import OSWORLD_ROUTES
from .sandbox import check_support
from .server_state import READ_ONLY_ROUTES, DesktopServer, desktop_of
from .session import Session
from .wire import DEFAULT_TOKEN_ENV, READY_LINE, READY_SOURCES

log = logging.getLogger("legato.desktop")


def guarded(endpoint, *, read_only: bool = False, resets: bool = False):
    """Errors become JSON answers here: bad input -> 400, anything else -> 500 with ``kind``
    ``crash`` when the display is gone. (Starlette's catch-all handler re-raises, and
    uvicorn then drops the keep-alive connection under the client's next request.) A route
    that is not ``read_only`` drops the desktop's quiet credit and prepared observation first
    (``DesktopServer.quiet_mark``, ``DesktopServer.prepared``) and, unless it ``resets``
    the desktop, is counted as a change (``DesktopServer.changes``, ``.changing`` while it
    runs: the next reset is then a real one)."""

    async def handler(request: Request) -> Response:
        changing = not read_only and not resets
        if not read_only:
            desktop = desktop_of(request)
            desktop.quiet_mark = None
            desktop.prepared.drop()
            if changing:
                desktop.changing += 1
                desktop.changes += 1
        try:
            return await endpoint(request)
        except ValueError as exc:  # BadRequest, InputError, bad commands
            return error_response(400, str(exc))
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.url.path)
            kind = "crash" if not desktop_of(request).session.alive() else "server"
            return error_response(500, f"{type(exc).__name__}: {exc}", kind)
        finally:
            if changing:
                desktop.changing -= 1

    return handler


def build_app(server: DesktopServer, token: str, *, manage_lifecycle: bool = True) -> TokenAuth:
    """The Starlette app of ``server`` (OSWorld's base routes and the ``/legato/`` routes),
    guarded by ``token``.

    ``manage_lifecycle``: start the session on startup and stop it on shutdown.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if manage_lifecycle:
            try:
                await server.start()
            except BaseException:  # what started is stopped: X, the sandbox, its cgroup and disk
                with contextlib.suppress(Exception):
                    await server.stop()
                raise
        try:
            yield
        finally:
            if manage_lifecycle:
                await server.stop()

    routes = [
        Route(
            path,
            guarded(endpoint, read_only=path in READ_ONLY_ROUTES, resets=path == "/legato/reset"),
            methods=methods,
        )
        for path, endpoint, methods in OSWORLD_ROUTES + LEGATO_ROUTES
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.desktop = server
    return TokenAuth(app, token)


# -- main --------------------------------------------------------------------------------------------


def own_network_forward() -> dict[int, int]:
    """``{port inside: free host port}`` for ``--network own``: OSWorld's CDP bridge (9222)
    and VLC (8080) ports, each on a host port the kernel picks as free on 127.0.0.1 (another
    program may take it before ``pasta`` binds it; the start then fails naming pasta's error)."""
    inside = (chrome.CDP_BRIDGE_PORT, home_mod.VLC_HTTP_PORT)
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in inside]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return {port: sock.getsockname()[1] for port, sock in zip(inside, socks, strict=True)}
    finally:
        for sock in socks:
            sock.close()


def _web(args: argparse.Namespace, state: Path) -> tuple[WebRecorder | None, list[str], list[Path]]:
    """``(recorder, google-chrome's flags, CAs the baseline HOME trusts)`` of ``--web``,
    ``--web-host``, ``--web-ca`` and ``--proxy`` (desktops/web.py, :mod:`.recorder`); exits
    with the problem for a bad value or a missing CA tool."""
    mode, _, archive = args.web.partition(":")
    if mode not in ("live", "record", "replay") or (mode != "live") != bool(archive):
        sys.exit(f"error: --web must be live, record:ARCHIVE or replay:ARCHIVE, got {args.web!r}")
    hosts = dict(h.split("=", 1) for h in args.web_host if "=" in h)
    trusted = list(args.web_ca)
    # in every mode, so the screens match (Chromium shows its "unsupported command-line flag"
    # bar for it: web_hosts are for stand-ins); through the recorder Chromium resolves no site
    rules = ", ".join(f"MAP {name} {addr}" for name, addr in hosts.items())
    resolve = [f"--host-resolver-rules={rules}"] if hosts else []
    if mode == "live":
        return None, chromium_flags(WebSettings(proxy=proxy_url(args.proxy))) + resolve, trusted
    if not args.sandbox:
        sys.exit(f"error: --web {mode} needs the sandbox (drop --no-sandbox)")
    try:
        ca = recorder_mod.ca_dir() / recorder_mod.CA_CERT
    except recorder_mod.RecorderError as exc:
        sys.exit(f"error: --web {mode}: {exc}")
    port = own_network_port()
    recorder = WebRecorder(
        mode,
        Path(archive),
        state / "web",
        port,
        upstream=proxy_url(args.proxy),
        hosts=hosts,
        trusted=trusted,
    )
    return recorder, [f"--proxy-server=http://127.0.0.1:{port}", *resolve], [*trusted, ca]


def own_network_port() -> int:
    """A port free on this host's loopback now (the recorder's, also inside the desktop's own
    network namespace, where every port is free)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _limits_arg(text: str) -> Caps | None:
    try:
        return parse_caps(json.loads(text))
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m legato_pipelines.desktops.server.main",
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
        default=None,
        choices=["libreoffice", "none"],
        help=(
            "copy this app's pre-built profile into the baseline HOME (repeatable; default:"
            " libreoffice when installed; none: no profile)"
        ),
    )
    parser.add_argument(
        "--session",
        default="plain",
        choices=["plain", "vm"],
        help="plain: openbox on black (default); vm: the look of OSWorld's Ubuntu VM (top bar"
        " with clock, dock, Yaru, Ubuntu font and colour, apps maximized as there)",
    )
    parser.add_argument(
        "--sandbox",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the task's processes in the desktop's own namespaces as OSWorld's `user`"
        " (default); --no-sandbox runs them on the host as --user, with no isolation",
    )
    parser.add_argument(
        "--network",
        choices=["host", "none", "own"],
        default=None,
        help="sandboxed desktops: none at all (a loopback of its own; the default); own: a"
        " network namespace of its own with a route out (pasta, package passt) and the"
        " Chrome DevTools bridge (9222) and VLC (8080) forwarded from free host ports, so"
        " desktops running Chrome or VLC at once do not collide (the ready line's 'ports');"
        " or host: the host's, every loopback service of the host included (a warning is"
        " logged). Unsandboxed desktops are on the host's network",
    )
    parser.add_argument(
        "--proxy",
        default=None,
        help="sandboxed desktops: the upstream proxy their Chromium uses, SCHEME://HOST:PORT"
        " (google-chrome's --proxy-server; desktops/web.py). Default: none",
    )
    parser.add_argument(
        "--web",
        default="live",
        help="sandboxed desktops: live (default: the sites themselves), record:ARCHIVE or"
        " replay:ARCHIVE (a recording proxy, or mitmproxy replaying, between Chromium and the"
        " sites, per attempt: recorder.py)",
    )
    parser.add_argument(
        "--web-host",
        action="append",
        default=[],
        help="NAME=ADDR[:PORT]: connect to ADDR for site NAME (Chromium's --host-resolver-rules"
        " live, the recorder's addon otherwise; repeatable)",
    )
    parser.add_argument(
        "--web-ca",
        action="append",
        default=[],
        type=Path,
        help="PEM file of a CA the desktops' Chromium (and the recorder) trusts for sites"
        " (repeatable)",
    )
    parser.add_argument(
        "--limits",
        type=_limits_arg,
        default=Caps(),
        help="sandboxed desktops' resource caps (limits.py): true (the defaults: memory 4g,"
        " pids 2048, disk 8g, cpus half the host's, cpu_weight and io_weight 100), a JSON object overriding some,"
        ' e.g. \'{"pids": 512, "memory": "1g"}\', or false (no caps: a fork bomb or memory'
        " hog inside then reaches the host)",
    )
    parser.add_argument(
        "--ready-source",
        choices=READY_SOURCES,
        default="damage",
        help="source of the ready wait: the X server's drawing reports (DAMAGE; polls frames"
        " when the server lacks it) or frame polling only (docs/local-desktop.md §6)",
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if args.prebuild is not None and "none" in args.prebuild and len(set(args.prebuild)) > 1:
        parser.error("--prebuild none cannot be combined with an app (drop one of them)")
    return args


def main(argv: list[str] | None = None) -> None:
    """Start one desktop and serve it until SIGTERM/SIGINT.

    Prints one line ``LEGATO_DESKTOP_READY {"url", "display", "pid", "home", "host_home",
    "ports"}`` (``ports``: :meth:`.Session.osworld_ports`) on stdout once
    the desktop is up and the port accepts connections; everything else goes to stderr.
    """
    import uvicorn

    args = parse_args(argv)
    token = os.environ.pop(args.token_env, "")
    if not token:
        sys.exit(
            f"error: environment variable {args.token_env} (the desktop token) is not set or empty"
        )
    if args.sandbox:
        support = check_support()
        if not support.ok:
            sys.exit(f"error: {support.problem}")
        args.network = args.network or "none"
        if args.network == "host":
            from ..network import HOST_WARNING

            print(f"warning: {HOST_WARNING}", file=sys.stderr, flush=True)
    elif args.network not in (None, "host"):
        sys.exit(f"error: --network {args.network} needs the sandbox (drop --no-sandbox)")
    else:
        args.network = "host"
    become_subreaper()
    own_state = args.state_dir is None
    if own_state:
        sweep()  # what servers killed with SIGKILL left in the temp folder
    state = Path(scratch_dir("legato-desktop-")) if own_state else args.state_dir
    recorder, browser_flags, trusted = _web(args, state)
    session = Session(
        width=args.width,
        height=args.height,
        state_dir=state,
        user=args.user,
        template=args.template,
        prebuild=None if args.prebuild is None else tuple(a for a in args.prebuild if a != "none"),
        sandbox=args.sandbox,
        network=args.network == "host",
        forward=own_network_forward() if args.network == "own" else None,
        limits=args.limits if args.sandbox else None,
        browser_flags=browser_flags,
        trusted_cas=trusted,
        session=args.session,
    )
    server = DesktopServer(
        session, remove_state=own_state or args.remove_state, ready_source=args.ready_source
    )
    server.recorder = recorder
    if recorder is not None:  # infrastructure: a reset between attempts does not kill it
        session.services.append(recorder.root_pid)
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
                    "home": session.desktop_home,
                    "host_home": str(session.home),
                    "ports": session.osworld_ports(),
                }
                try:
                    print(f"{READY_LINE} {json.dumps(ready)}", flush=True)
                except BrokenPipeError:  # whoever started this server is gone: end quietly
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, 1)
                    os.close(null)
                    uv.should_exit = True  # uvicorn >= 0.46 then runs its shutdown
                    return
                os.dup2(2, 1)  # nothing else goes to stdout

        uv.startup = announce
        await uv.serve(sockets=[sock])

    asyncio.run(serve())  # uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown


if __name__ == "__main__":
    main()
