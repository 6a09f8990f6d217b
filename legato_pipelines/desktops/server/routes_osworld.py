"""OSWorld's base routes of a local desktop server (request/response shapes of OSWorld's
``desktop_env/server/main.py``): screenshot, commands, launching and opening, windows, files.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ...osworld_format.controller import EXECUTE_TIMEOUT_S, WINDOW_FOUND_HEADER
from . import accessibility as a11y
from . import apps
from .procs import OutputTooLarge
from .route_params import error_response, param, request_params
from .server_state import desktop_of

OPEN_FILE_TIMEOUT_S = 60.0
FILE_TIMEOUT_S = 60.0


async def screenshot(request: Request) -> Response:
    s = desktop_of(request)
    png = await s.x.run(lambda: s.x.ctx().screen.png())
    return Response(png, media_type="image/png")


async def execute(request: Request) -> Response:
    s = desktop_of(request)
    p = await request_params(request)
    shell = param(p, "shell", bool, False)
    argv = apps.command_argv(param(p, "command", (str, list)), shell, s.home)
    timeout = float(param(p, "timeout", (int, float), EXECUTE_TIMEOUT_S))
    try:
        done = await s.run_command(argv, shell, timeout)
    except subprocess.TimeoutExpired as exc:  # with what it wrote so far
        return JSONResponse(
            {
                "status": "error",
                "message": f"Command timed out after {timeout:g} seconds",
                "kind": "timeout",
                "output": (exc.output or b"").decode(errors="replace"),
                "error": (exc.stderr or b"").decode(errors="replace"),
            },
            status_code=500,
        )
    except OutputTooLarge as exc:
        return error_response(413, f"{argv!r} wrote more than {exc.limit} bytes: stopped")
    except OSError as exc:
        return error_response(500, f"cannot run {argv!r}: {exc}")
    return JSONResponse(
        {
            "status": "success",
            "output": done.stdout.decode(errors="replace"),
            "error": done.stderr.decode(errors="replace"),
            "returncode": done.returncode,
        }
    )


async def launch(request: Request) -> Response:
    s = desktop_of(request)
    p = await request_params(request)
    shell = param(p, "shell", bool, False)
    argv = apps.command_argv(param(p, "command", (str, list)), shell, s.home)
    before = await s.task_pids()
    try:
        proc, known = await s.x.run(s._launch_app, argv, shell)
    except OSError as exc:
        return error_response(500, f"cannot launch {argv!r}: {exc}")
    shown = argv if isinstance(argv, str) else " ".join(argv)
    code = await s.died_at_once(proc, before)
    if code is not None:
        how = f"exited with {code} at once" + (", leaving no process running" if code == 0 else "")
        return JSONResponse(
            {
                "status": "error",
                "message": f"{shown} {how}: {s.apps_log_tail()}",
                "kind": "setup",
                "returncode": code,
            },
            status_code=500,
        )
    # a terminal's or the editor's window: managed before the answer
    await s.window_after_launch(apps.program_of(argv), known)
    return PlainTextResponse(f"{shown} launched successfully")


async def open_file(request: Request) -> Response:
    s = desktop_of(request)
    p = await request_params(request)
    raw = param(p, "path")
    timeout = float(param(p, "timeout", (int, float), OPEN_FILE_TIMEOUT_S))
    path = apps.resolve_path(raw, s.home)
    if await s.exists(path):
        argv = apps.opener_for(path)
    elif apps.shutil.which(raw):
        argv = [raw]
    else:
        return error_response(404, f"File not found: {path}")
    await s.x.run(s._spawn_app, argv, False)
    name = os.path.basename(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await s.x.run(lambda: s.x.ctx().windows.find(name))
        if found:
            await s.x.run(lambda wid=found[-1].id: s.x.ctx().windows.activate(wid))
            return PlainTextResponse("File opened successfully")
        await asyncio.sleep(0.05)
    return error_response(
        500, f"no window titled with {name!r} appeared within {timeout:g} s", "timeout"
    )


def window_route(close: bool):
    async def handler(request: Request) -> Response:
        s = desktop_of(request)
        p = await request_params(request)
        name = param(p, "window_name")
        strict = param(p, "strict", bool, False)
        by_class = param(p, "by_class", bool, False)

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

        found = await s.x.run(act)
        # OSWorld's server on Linux runs `wmctrl -a/-c` and answers 200 whatever wmctrl found
        # (its exit status is not read): a task whose window is not there carries on as on the
        # VM, with no setup failure; the header says whether a window matched
        return PlainTextResponse(
            "Window closed successfully." if close else "Window activated successfully",
            headers={WINDOW_FOUND_HEADER: "true" if found else "false"},
        )

    return handler


async def upload(request: Request) -> Response:
    s = desktop_of(request)
    form = await request.form()
    path = form.get("file_path")
    data = form.get("file_data")
    if not isinstance(path, str) or data is None:
        return error_response(
            400, "multipart fields 'file_path' (text) and 'file_data' (file) are required"
        )
    content = await data.read() if hasattr(data, "read") else str(data).encode()
    target = apps.resolve_path(path, s.home)
    script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
    done = await s.run_command(
        ["sh", "-c", script, "sh", target], False, FILE_TIMEOUT_S, input=content
    )
    if done.returncode != 0:
        return error_response(
            500, f"cannot write {target}: {done.stderr.decode(errors='replace').strip()}"
        )
    return PlainTextResponse("File uploaded successfully")


async def file(request: Request) -> Response:
    s = desktop_of(request)
    p = await request_params(request)
    target = apps.resolve_path(param(p, "file_path"), s.home)
    try:
        done = await s.run_command(["cat", "--", target], False, FILE_TIMEOUT_S)
    except OutputTooLarge as exc:  # a sparse file of any size costs the task no disk
        return error_response(413, f"{target} is larger than {exc.limit} bytes: not sent")
    if done.returncode != 0:
        return error_response(404, f"File not found: {target}")
    return Response(done.stdout, media_type="application/octet-stream")


async def platform(request: Request) -> Response:
    return PlainTextResponse("Linux")


async def screen_size(request: Request) -> Response:
    s = desktop_of(request)
    return JSONResponse({"width": s.session.width, "height": s.session.height})


async def cursor_position(request: Request) -> Response:
    s = desktop_of(request)
    return JSONResponse(list(await s.x.run(lambda: s.x.ctx().input.pointer())))


async def terminal(request: Request) -> Response:
    return JSONResponse({"output": None, "status": "success"})


async def accessibility(request: Request) -> Response:
    """``{"AT": xml}``: the AT-SPI tree as OSWorld's server builds it (:mod:`.accessibility`),
    or one ``<frame>`` per window where AT-SPI is missing or the dump fails."""
    s = desktop_of(request)
    if s.session.bus is not None and not a11y.missing():
        try:
            done = await s.run_command(a11y.dump_argv(), False, a11y.DUMP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.startswith(b"<desktop-frame"):
            return JSONResponse({"AT": done.stdout.decode(errors="replace")})
    return JSONResponse({"AT": await s.x.run(lambda: s.x.ctx().windows.accessibility_xml())})


async def desktop_path(request: Request) -> Response:
    s = desktop_of(request)
    return JSONResponse({"desktop_path": os.path.join(s.home, "Desktop")})


#: (path, endpoint, methods) of OSWorld's base routes.
OSWORLD_ROUTES = [
    ("/screenshot", screenshot, ["GET"]),
    ("/execute", execute, ["POST"]),
    ("/setup/execute", execute, ["POST"]),
    ("/setup/launch", launch, ["POST"]),
    ("/setup/open_file", open_file, ["POST"]),
    ("/setup/activate_window", window_route(close=False), ["POST"]),
    ("/setup/close_window", window_route(close=True), ["POST"]),
    ("/setup/upload", upload, ["POST"]),
    ("/file", file, ["POST"]),
    ("/platform", platform, ["GET"]),
    ("/screen_size", screen_size, ["GET", "POST"]),
    ("/cursor_position", cursor_position, ["GET"]),
    ("/terminal", terminal, ["GET"]),
    ("/accessibility", accessibility, ["GET"]),
    ("/desktop_path", desktop_path, ["POST", "GET"]),
]
