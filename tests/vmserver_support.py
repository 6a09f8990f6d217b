"""A plain-OSWorld stand-in for tests: a local desktop server seen through a reverse proxy
that speaks only OSWorld's base API (no ``/legato/`` routes, no token from the client)."""

from __future__ import annotations

import socket
import threading

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

#: OSWorld's in-VM server routes the base-API mode may use (docs/osworld.md §2).
BASE_ROUTES = frozenset(
    {
        "/screenshot",
        "/execute",
        "/setup/execute",
        "/setup/launch",
        "/setup/open_file",
        "/setup/activate_window",
        "/setup/close_window",
        "/setup/upload",
        "/file",
        "/platform",
        "/screen_size",
        "/cursor_position",
        "/terminal",
    }
)


class BaseApiProxy:
    """A plain-OSWorld stand-in: forwards the base routes to ``upstream`` with its token,
    404 for anything else; records ``(method, path, had_authorization)`` of every request."""

    def __init__(self, upstream: str, token: str):
        self.seen: list[tuple[str, str, bool]] = []
        self._upstream, self._token = upstream, token
        app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])],
        )
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    async def _forward(self, request: Request) -> Response:
        path = request.url.path
        self.seen.append((request.method, path, "authorization" in request.headers))
        if path not in BASE_ROUTES:
            return Response("Not Found", status_code=404)
        headers = {"Authorization": f"Bearer {self._token}"}
        if "content-type" in request.headers:
            headers["Content-Type"] = request.headers["content-type"]
        async with httpx.AsyncClient(base_url=self._upstream, timeout=300) as client:
            answer = await client.request(
                request.method, path, content=await request.body(), headers=headers
            )
        keep = {k: v for k, v in answer.headers.items() if k.lower() == "content-type"}
        return Response(answer.content, status_code=answer.status_code, headers=keep)

    def __enter__(self) -> BaseApiProxy:
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(10)
