"""Async client of a desktop server: OSWorld's base API (``DesktopController``) plus ``/legato/``.

Works against the local desktop server and, for the base routes, against any server of
OSWorld's API by URL. Every transport failure, timeout, refused token or server error becomes
a :class:`~legato_pipelines.errors.DesktopError` whose ``kind`` says which (``transport``,
``timeout``, or the server's own ``kind``: ``reset``, ``crash``, ...). The token travels in
the ``Authorization`` header only; it never appears in an error message.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import httpx

from ..actions import Action
from ..errors import DesktopError
from ..images import Screenshot
from ..osworld_format.controller import EXECUTE_TIMEOUT_S, WINDOW_FOUND_HEADER, window_found

DEFAULT_TIMEOUT_S = 30.0
RESET_TIMEOUT_S = 60.0


def action_json(action: Action) -> dict[str, Any]:
    """The JSON body of ``POST /legato/act``: the :class:`Action` fields (``keys`` as a list)."""
    data = {f.name: getattr(action, f.name) for f in fields(Action)}
    data["keys"] = list(action.keys)
    return data


class DesktopClient:
    """One desktop server at ``url`` with its ``token`` (``None``: no ``Authorization`` header,
    for OSWorld's in-VM server, which has no token).

    Implements :class:`~legato_pipelines.osworld_format.controller.DesktopController`. ``timeout`` is
    the default per-request timeout in seconds (commands and resets get longer ones).
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=httpx.Timeout(timeout),
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"DesktopClient({self.url!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        kind: str,
        allow: tuple[int, ...] = (),
        timeout: float | None = None,
        **kwargs,
    ) -> httpx.Response:
        extra = {"timeout": timeout} if timeout is not None else {}
        try:
            response = await self._http.request(method, path, **kwargs, **extra)
        except httpx.TimeoutException:
            raise DesktopError(
                f"{method} {self.url}{path}: no answer within the timeout", kind="timeout"
            ) from None
        except httpx.HTTPError as exc:
            raise DesktopError(
                f"{method} {self.url}{path}: {type(exc).__name__}: {exc}", kind="transport"
            ) from None
        response.stream = None  # read and closed: no Response <-> stream cycle for the GC
        if response.status_code < 400 or response.status_code in allow:
            return response
        if response.status_code == 401:
            raise DesktopError(
                f"{method} {self.url}{path}: the server refused the desktop token (401)",
                kind="transport",
            )
        message, server_kind = response.text[:500], None
        try:
            body = response.json()
            message, server_kind = body.get("message", message), body.get("kind")
        except ValueError:
            pass
        raise DesktopError(
            f"{method} {self.url}{path}: HTTP {response.status_code}: {message}",
            kind=server_kind or kind,
        )

    # -- DesktopController (OSWorld's base API) --------------------------------------------------

    async def execute(
        self, command: list[str] | str, shell: bool = False, timeout: float = EXECUTE_TIMEOUT_S
    ) -> dict[str, Any]:
        """``POST /execute`` as the desktop user in its HOME; ``{status, output, error, returncode}``.

        A command the server could not run or that timed out gives ``status "error"``,
        ``returncode None`` and the reason in ``error`` (OSWorld answers 500 there).
        """
        return await self._execute("/execute", command, shell, timeout)

    async def setup_execute(
        self, command: list[str] | str, shell: bool = False, timeout: float = EXECUTE_TIMEOUT_S
    ) -> dict[str, Any]:
        """``POST /setup/execute`` (OSWorld's setup twin of ``/execute``; same answer)."""
        return await self._execute("/setup/execute", command, shell, timeout)

    async def _execute(
        self, path: str, command: list[str] | str, shell: bool, timeout: float
    ) -> dict[str, Any]:
        response = await self._request(
            "POST",
            path,
            kind="setup",
            allow=(500,),
            timeout=timeout + 10.0,
            json={"command": command, "shell": shell, "timeout": timeout},
        )
        body = response.json()
        if response.status_code == 500:
            return {
                "status": "error",
                "output": body.get("output", ""),  # a timed-out command: what it wrote
                "error": body.get("message", ""),
                "returncode": None,
            }
        return body

    async def launch(self, command: list[str] | str, shell: bool = False) -> None:
        """``POST /setup/launch``. Raises ``DesktopError(kind="setup")`` when the server cannot
        start it or it exits non-zero at once (``exit_status`` attribute: its exit status)."""
        response = await self._request(
            "POST",
            "/setup/launch",
            kind="setup",
            allow=(500,),
            json={"command": command, "shell": shell},
        )
        if response.status_code == 500:
            body = response.json()
            error = DesktopError(
                f"POST {self.url}/setup/launch: {body.get('message', '')}", kind="setup"
            )
            error.exit_status = body.get("returncode")
            raise error

    async def open_file(self, path: str, timeout: float = 60.0) -> None:
        await self._request(
            "POST",
            "/setup/open_file",
            kind="setup",
            timeout=timeout + 10.0,
            json={"path": path, "timeout": timeout},
        )

    async def activate_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> bool | None:
        """``POST /setup/activate_window``: see :meth:`_window_step`."""
        return await self._window_step("activate_window", window_name, strict, by_class)

    async def close_window(
        self, window_name: str, strict: bool = False, by_class: bool = False
    ) -> bool | None:
        """``POST /setup/close_window``: see :meth:`_window_step`."""
        return await self._window_step("close_window", window_name, strict, by_class)

    async def _window_step(
        self, route: str, window_name: str, strict: bool, by_class: bool
    ) -> bool | None:
        """No window matching is not an error: OSWorld's server on Linux answers 200 whatever
        ``wmctrl`` found, and so does the local one, which says whether a window matched in
        :data:`WINDOW_FOUND_HEADER`: returned as ``True`` / ``False`` (``None``: the server
        does not say). Raises ``DesktopError`` (kind ``setup``) when the server refuses the
        request (e.g. no ``window_name``)."""
        response = await self._request(
            "POST",
            f"/setup/{route}",
            kind="setup",
            json={"window_name": window_name, "strict": strict, "by_class": by_class},
        )
        return window_found(response.headers.get(WINDOW_FOUND_HEADER))

    async def upload(self, path: str, data: bytes) -> None:
        await self._request(
            "POST",
            "/setup/upload",
            kind="setup",
            timeout=120.0,
            data={"file_path": path},
            files={"file_data": ("file", data)},
        )

    async def file(self, path: str) -> bytes | None:
        response = await self._request(
            "POST", "/file", kind="evaluator", allow=(404,), data={"file_path": path}
        )
        return None if response.status_code == 404 else response.content

    async def screen_size(self) -> tuple[int, int]:
        body = (await self._request("POST", "/screen_size", kind="transport")).json()
        return (int(body["width"]), int(body["height"]))

    # -- more of OSWorld's API -----------------------------------------------------------------

    async def screenshot(self) -> bytes:
        """``GET /screenshot``: PNG bytes."""
        return (await self._request("GET", "/screenshot", kind="observe")).content

    async def platform(self) -> str:
        return (await self._request("GET", "/platform", kind="transport")).text

    async def cursor_position(self) -> tuple[int, int]:
        x, y = (await self._request("GET", "/cursor_position", kind="transport")).json()
        return (int(x), int(y))

    async def terminal(self) -> dict[str, Any]:
        return (await self._request("GET", "/terminal", kind="transport")).json()

    async def accessibility(self) -> str:
        return (await self._request("GET", "/accessibility", kind="transport")).json()["AT"]

    # -- project endpoints -------------------------------------------------------------------------

    async def observe(self, size: tuple[int, int] | None = None) -> Screenshot:
        """``/legato/observe``: the screen as a :class:`Screenshot`; with ``size`` (width,
        height: the model's) resized to it by the server. A server that does not know the
        query answers the whole screen (the engine then resizes it). The size is the PNG's
        own (its IHDR); ``DesktopError(kind="observe")`` when the answer is not a PNG."""
        params = {"width": size[0], "height": size[1]} if size is not None else None
        response = await self._request("GET", "/legato/observe", kind="observe", params=params)
        try:
            return Screenshot(response.content)
        except ValueError:
            raise DesktopError(
                f"GET {self.url}/legato/observe: the answer is not a PNG", kind="observe"
            ) from None

    async def act(self, action: Action) -> float:
        """``/legato/act``: perform ``action`` as XTest input; returns the server's act_s."""
        timeout = DEFAULT_TIMEOUT_S + float(action.seconds or 0.0)
        body = (
            await self._request(
                "POST", "/legato/act", kind="act", timeout=timeout, json=action_json(action)
            )
        ).json()
        return float(body["act_s"])

    async def wait(
        self, mode: str = "action", source: str | None = None, **overrides: float
    ) -> dict[str, Any]:
        """``/legato/wait``: wait server-side until the screen is ready.

        ``mode``: ``action`` | ``launch`` | ``reset`` | ``eval``; ``source``: ``damage`` |
        ``poll`` (``None``: the server's default); ``overrides``: ``stable_s``, ``quiet_s``,
        ``timeout_s``, ``interval_s``, ``tick_s``, ``app_window_s`` (seconds; the last: the
        cap of a launch/reset wait for a launched app's main window, when longer than
        ``timeout_s``). Returns ``{mode, ready_s, frames,
        changed, timed_out, source}`` (``source``: what the wait watched).
        """
        if source is not None:
            overrides = {**overrides, "source": source}
        timeout = DEFAULT_TIMEOUT_S + max(
            float(overrides.get("timeout_s") or 10.0), float(overrides.get("app_window_s") or 0.0)
        )
        return (
            await self._request(
                "POST",
                "/legato/wait",
                kind="observe",
                timeout=timeout,
                json={"mode": mode, **overrides},
            )
        ).json()

    async def reset(self, full: bool = False) -> dict[str, Any]:
        """``/legato/reset``: ``{kind: fast|full, reset_s, ...}`` (full when asked or needed)."""
        return (
            await self._request(
                "POST", "/legato/reset", kind="reset", timeout=RESET_TIMEOUT_S, json={"full": full}
            )
        ).json()

    async def health(self, timeout: float | None = None) -> dict[str, Any]:
        return (await self._request("GET", "/legato/health", kind="crash", timeout=timeout)).json()

    async def legato_health(self, timeout: float | None = None) -> dict[str, Any] | None:
        """``GET /legato/health``, or ``None`` when the server does not have the route (404/405:
        a plain OSWorld in-VM server, base API only). Raises ``DesktopError`` like :meth:`health`
        (a 401 too: a legato server refused the token)."""
        response = await self._request(
            "GET", "/legato/health", kind="crash", allow=(404, 405), timeout=timeout
        )
        return None if response.status_code in (404, 405) else response.json()

    async def web_begin(self, task_id: str) -> dict[str, Any]:
        """``POST /legato/web``: start the web recorder's attempt for ``task_id`` (desktop
        option ``web`` record/replay); ``{"mode", "task", "archived"}``."""
        return (
            await self._request(
                "POST", "/legato/web", kind="reset", timeout=RESET_TIMEOUT_S, json={"task": task_id}
            )
        ).json()

    async def web_misses(self) -> list[dict[str, str]]:
        """``GET /legato/web``: the running replay attempt's requests not in the archive."""
        return list((await self._request("GET", "/legato/web", kind="evaluator")).json()["misses"])

    async def processes(self) -> dict[str, Any]:
        return (await self._request("GET", "/legato/processes", kind="transport")).json()

    async def windows(self) -> list[dict[str, Any]] | None:
        """``GET /legato/windows``: the managed top-level windows, oldest first, each
        ``{id, title, instance, class, pid, launched}``; ``None`` from a server without the route (an older
        ``legato desktop serve``)."""
        response = await self._request("GET", "/legato/windows", kind="observe", allow=(404,))
        return None if response.status_code == 404 else list(response.json()["windows"])

    async def close_windows(self, ids: list[int]) -> dict[int, str]:
        """``POST /legato/windows/close``: close windows ``ids`` (asked, then their client
        killed after ~1 s); ``{id: "closed" | "killed" | "open" | "gone"}``."""
        body = (
            await self._request(
                "POST", "/legato/windows/close", kind="observe", json={"ids": list(ids)}
            )
        ).json()
        return {int(wid): str(result) for wid, result in body["closed"].items()}
