"""The project's ``/legato/`` routes of a local desktop server: structured actions as XTest
input, the ready wait, observe, reset, health, the task's processes and its windows.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .app_windows import window_pids
from .limits import RESOURCE_LIMIT
from .procs import own_process_table
from .recorder import RecorderError
from .route_params import BadRequest, error_response, param, parse_action, request_params
from .screen import model_png
from .server_state import desktop_of
from .session import SessionError


async def act(request: Request) -> Response:
    s = desktop_of(request)
    action = parse_action(await request_params(request))
    t0 = time.perf_counter()
    if action.action == "wait":
        await asyncio.sleep(min(float(action.seconds or 0.0), 60.0))
    else:
        await s.x.run(s.perform, action)
    return _limit_hit(s) or JSONResponse({"act_s": time.perf_counter() - t0})


async def wait(request: Request) -> Response:
    s = desktop_of(request)
    p = await request_params(request)
    mode = param(p, "mode", str, "action")
    source = param(p, "source", str, None)
    overrides = {
        k: p.get(k)
        for k in ("stable_s", "quiet_s", "timeout_s", "interval_s", "tick_s", "app_window_s")
    }
    for key, value in overrides.items():
        if value is not None and (not isinstance(value, (int, float)) or value <= 0):
            raise BadRequest(f"field {key!r} must be a positive number of seconds")
    try:
        result = await s.wait_ready(mode, source, **overrides)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return _limit_hit(s) or JSONResponse({"mode": mode, **result.to_json()})


def _limit_hit(s) -> Response | None:
    """HTTP 507, kind ``resource_limit``, when the desktop hit a resource cap since its last
    reset (:mod:`.limits`): checked where the desktop reports back (after an action, after a
    wait, so before the evaluation too); the engine records the attempt as a desktop failure
    of that type and the next reset reverts the sandbox."""
    cap = s.session.limit_hit()
    if cap is None:
        return None
    return error_response(507, s.session.sandbox.limits.message(cap), RESOURCE_LIMIT)


async def observe(request: Request) -> Response:
    """The screen as PNG; with ``?width=W&height=H`` (the model's size) resized to it here
    (``screen.model_png``), so the collector does no pixel work; the one prepared during the
    last wait when the screen has not changed since (:mod:`.prepared_obs`). Headers:
    ``X-Screen-Width`` / ``-Height`` (the screen), ``X-Image-Width`` / ``-Height`` (the PNG),
    ``X-Observe-S``, ``X-Observe-Prepared`` (1: the prepared grab)."""
    s = desktop_of(request)
    size = _model_size(request)
    t0 = time.perf_counter()
    prepared = None
    if size is None or size == (s.session.width, s.session.height):
        png, screen = await s.x.run(lambda: (s.x.ctx().screen.png(), s.x.ctx().screen.size))
        image = screen
    elif (prepared := await s.prepared.take(size)) is not None:
        png, screen = prepared  # grabbed during the wait's quiet window, nothing changed since
        image = size
    else:
        raw, screen = await s.x.run(lambda: s.x.ctx().screen.grab())
        png = await asyncio.to_thread(model_png, raw, screen, size)
        image = size
    headers = {
        "X-Screen-Width": str(screen[0]),
        "X-Screen-Height": str(screen[1]),
        "X-Image-Width": str(image[0]),
        "X-Image-Height": str(image[1]),
        "X-Observe-S": f"{time.perf_counter() - t0:.6f}",
        "X-Observe-Prepared": "1" if prepared is not None else "0",
    }
    return Response(png, media_type="image/png", headers=headers)


MAX_SIDE = 16384


def _model_size(request: Request) -> tuple[int, int] | None:
    """``(width, height)`` from the query (both or neither), or ``None``; :class:`BadRequest`
    when they are not whole numbers of pixels in [1, 16384]."""
    query = request.query_params
    if "width" not in query and "height" not in query:
        return None
    try:
        size = (int(query["width"]), int(query["height"]))
    except (KeyError, ValueError):
        raise BadRequest("observe: give both width and height, in pixels") from None
    if not all(1 <= v <= MAX_SIDE for v in size):
        raise BadRequest(f"observe: width and height must be 1..{MAX_SIDE} pixels, got {size}")
    return size


async def reset(request: Request) -> Response:
    s = desktop_of(request)
    p = await request_params(request)
    try:
        return JSONResponse(await s.reset(param(p, "full", bool, False)))
    except SessionError as exc:
        return error_response(500, f"reset failed: {exc}", "reset")


async def web(request: Request) -> Response:
    """``POST /legato/web {task}``: start the web recorder's attempt for ``task`` in the
    running sandbox's network (:mod:`.recorder`); ``GET``: ``{"mode", "task", "misses"}`` of
    the running attempt. 404 when the desktop has no recorder (desktop option ``web=live``)."""
    s = desktop_of(request)
    recorder = s.recorder
    if recorder is None:
        return error_response(404, "this desktop records and replays no web (web=live)", "setup")
    if request.method == "GET":
        misses = await asyncio.to_thread(recorder.misses)
        return JSONResponse({"mode": recorder.mode, "task": recorder.task, "misses": misses})
    p = await request_params(request)
    task = param(p, "task", str, "")
    sandbox = s.session.sandbox
    netns = sandbox.init_pid if sandbox is not None and not sandbox.network else None
    try:
        return JSONResponse(await asyncio.to_thread(recorder.begin, task, netns))
    except ValueError as exc:
        return error_response(400, str(exc), "setup")
    except RecorderError as exc:
        return error_response(500, f"web recorder: {exc}", "setup")


async def health(request: Request) -> Response:
    s = desktop_of(request)
    sess = s.session
    return JSONResponse(
        {
            "ok": sess.alive(),
            "display": sess.display,
            "user": sess.user,
            "home": sess.desktop_home,
            "host_home": str(sess.home),
            "sandbox": sess.sandbox.describe() if sess.sandbox is not None else None,
            "limits": (
                sess.sandbox.limits.describe()
                if sess.sandbox is not None and sess.sandbox.limits is not None
                else None
            ),
            "session_bus": (
                {
                    "address": sess.task_env()["DBUS_SESSION_BUS_ADDRESS"],
                    "running": sess.bus.alive(),
                }
                if sess.bus is not None
                else {"missing": sess.bus_missing}
            ),
            "ports": sess.osworld_ports(),
            "width": sess.width,
            "height": sess.height,
            "pid": os.getpid(),
            # objects out of the cyclic collector's reach: the template's, in a forked server
            "gc_frozen": gc.get_freeze_count(),
            "generation": sess.generation,
        }
    )


async def processes(request: Request) -> Response:
    s = desktop_of(request)

    def collect() -> dict:
        table = s.session.process_table()
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


async def windows(request: Request) -> Response:
    """The managed top-level windows, oldest first: ``{"windows": [{id, title, instance,
    class, pid, launched}]}``. ``pid``: the host pid of the window's X client (``None`` when
    the X server cannot tell, :mod:`.app_windows`); ``launched``: that process belongs to an
    app launched since the reset (``/setup/launch``, ``/setup/open_file``, Ctrl+Alt+T), so
    the popup guard takes the window for the app's, never for a popup."""
    s = desktop_of(request)
    table = await asyncio.to_thread(own_process_table)
    launched = s.launched_pids(table)

    def collect():
        ctx = s.x.ctx()
        found = ctx.windows.clients()
        return found, window_pids(ctx.display, [w.id for w in found])

    found, pids = await s.x.run(collect)
    return JSONResponse(
        {
            "windows": [
                {
                    "id": w.id,
                    "title": w.title,
                    "instance": w.wm_class[0],
                    "class": w.wm_class[1],
                    "pid": pids.get(w.id),
                    "launched": pids.get(w.id) in launched,
                }
                for w in found
            ]
        }
    )


async def close_windows(request: Request) -> Response:
    """``{"ids": [...]}``: close those windows (asked, then killed): ``{"closed": {id: outcome}}``."""
    s = desktop_of(request)
    ids = param(await request_params(request), "ids", list)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest("field 'ids' must be a list of window ids (integers)")
    outcome = await s.close_windows(ids)
    return JSONResponse({"closed": {str(wid): result for wid, result in outcome.items()}})


#: (path, endpoint, methods) of the project's ``/legato/`` routes.
LEGATO_ROUTES = [
    ("/legato/act", act, ["POST"]),
    ("/legato/wait", wait, ["POST"]),
    ("/legato/observe", observe, ["GET", "POST"]),
    ("/legato/reset", reset, ["POST"]),
    ("/legato/health", health, ["GET"]),
    ("/legato/web", web, ["GET", "POST"]),
    ("/legato/processes", processes, ["GET"]),
    ("/legato/windows", windows, ["GET"]),
    ("/legato/windows/close", close_windows, ["POST"]),
]
