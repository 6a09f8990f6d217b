"""Desktops on other hosts: desktop servers reached by URL, health-checked.

A collector drives one policy version's desktops over HTTP wherever they run (``legato
desktop serve`` on desktop hosts), so desktops scale by adding hosts. This module opens such a
pool for the ``local`` backend when ``DesktopConfig.options["urls"]`` is set, optionally with
more desktops started on this host besides (``options["local"]``).

A URL may also be an OSWorld VM's own in-VM server (port 5000, base API, no token): the
first ``GET /legato/health`` answering 404/405 says so, and that desktop is driven in base-API
mode (:class:`~legato_pipelines.desktops.server.vmserver.VMServerDesktop`: fast reset, setup and
evaluation through the API; no snapshot revert).

Options (besides the local backend's own, which apply to the desktops started here):
  urls          desktop server URLs (``http://HOST:PORT``) on any host
  token_env     environment variable holding the legato servers' token (default
                LEGATO_DESKTOP_TOKEN; OSWorld VM servers need none)
  local         desktops to start on this host as well (default 0)
  reconnect_s   seconds ``recover()`` keeps trying a server that stopped answering before the
                desktop is given up for the rest of the batch (default 20; ``legato desktop
                serve`` restarts a dead server within a few seconds)

Health checks: before the batch every URL is asked ``/legato/health`` concurrently; servers
that do not answer are left out (logged), and the batch fails only when no desktop at all is
left. Before every attempt the desktop's server is asked again, so an attempt never starts on
a vanished host: the engine records the failure as an ``env`` error, re-queues the attempt on
the other desktops (``env_retries``) and calls ``recover()``, which either finds the server
back (the desktop is *recovered*) or gives up (the desktop is *lost*). Both show in the
profile's ``desktops`` entry (:func:`legato_pipelines.rollout.profile.desktop_health`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any
from urllib.parse import urlsplit

from ...errors import ConfigError, DesktopError
from ...tasks import Task
from ..base import Desktop, DesktopConfig
from ..client import DesktopClient
from ..reconnect import reconnect
from .desktop import LocalDesktop, open_local_desktops
from .vmserver import attach_vm_server
from .wire import DEFAULT_TOKEN_ENV

log = logging.getLogger("legato_pipelines.desktops.server.remote")

HEALTH_TIMEOUT_S = 5.0
DEFAULT_RECONNECT_S = 20.0


def desktop_name(url: str) -> str:
    """The name records carry for a desktop at ``url``: ``HOST:PORT`` (so a profile says which
    host a lost desktop was on). Raises ``ConfigError`` for a URL without host or port."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise ConfigError(
            f"desktop option 'urls': {url!r} is not a desktop server URL (fix: http://HOST:PORT)"
        )
    return f"{parts.hostname}:{parts.port}"


class AttachedDesktop(LocalDesktop):
    """A desktop whose server runs elsewhere (another host, or ``legato desktop serve`` here).

    ``reset`` first checks the server answers (``DesktopError(kind="crash")`` when it does
    not); ``recover`` retries for ``reconnect_s`` seconds before giving the desktop up.
    """

    def __init__(self, url: str, client: DesktopClient, config: DesktopConfig, size, reconnect_s):
        super().__init__(desktop_name(url), client, config, size)
        self.reconnect_s = reconnect_s

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        try:
            health = await self.client.health(timeout=HEALTH_TIMEOUT_S)
        except DesktopError as exc:
            raise DesktopError(
                f"{self.name}: desktop server does not answer before the attempt: {exc}",
                kind="crash",
            ) from None
        if not health.get("ok"):
            raise DesktopError(f"{self.name}: desktop server reports not ok", kind="crash")
        return await super().reset(task, seed=seed)

    async def recover(self) -> None:
        await reconnect(self.name, super().recover, self.reconnect_s)


async def _probe(url: str, token: str, config: DesktopConfig, reconnect_s: float) -> Desktop | str:
    """The desktop at ``url``, or why it is left out. Detects once which API it speaks:
    ``/legato/health`` answering 404/405 means a plain OSWorld server (base-API mode)."""
    client = DesktopClient(url, token or None)
    try:
        health: dict[str, Any] | None = await client.legato_health(timeout=HEALTH_TIMEOUT_S)
    except DesktopError as exc:
        await client.aclose()
        return str(exc)
    if health is None:
        await client.aclose()  # the token stays with legato servers
        try:
            return await attach_vm_server(url, desktop_name(url), config, reconnect_s=reconnect_s)
        except DesktopError as exc:
            return f"OSWorld VM server: {exc}"
    if not health.get("ok"):
        await client.aclose()
        return "reports not ok"
    size = (int(health["width"]), int(health["height"]))
    return AttachedDesktop(url, client, config, size, reconnect_s)


async def open_remote_pool(config: DesktopConfig, n: int) -> list[Desktop]:
    """Up to ``n`` desktops: attached servers from ``options["urls"]`` that answer a health
    check (first; legato desktop servers as :class:`AttachedDesktop`, OSWorld VM servers as
    :class:`~legato_pipelines.desktops.server.vmserver.VMServerDesktop`), then desktops started here
    (at most ``options["local"]``).

    Raises ``ConfigError`` for bad options, ``n`` above the desktops configured, or no desktop
    answering while the token variable is unset; ``DesktopError(kind="crash")`` when no
    desktop answers.
    """
    options = dict(config.options)
    urls = [str(u) for u in options.pop("urls")]
    token_env = str(options.pop("token_env", DEFAULT_TOKEN_ENV))
    local = int(options.pop("local", 0))
    reconnect_s = float(options.pop("reconnect_s", DEFAULT_RECONNECT_S))
    names = [desktop_name(u) for u in urls]
    if len(set(names)) != len(names):
        raise ConfigError(f"desktop option 'urls' lists a server twice: {urls}")
    if local < 0:
        raise ConfigError(f"desktop option 'local' must be >= 0, got {local}")
    if n > len(urls) + local:
        raise ConfigError(
            f"desktop option 'urls' lists {len(urls)} servers"
            + (f" (and {local} started here)" if local else "")
            + f" but {n} desktops are to be opened (one server per runner and per spare)"
        )
    token = os.environ.get(token_env, "")
    probes = await asyncio.gather(*(_probe(u, token, config, reconnect_s) for u in urls))
    pool: list[Desktop] = []
    down = []
    for url, probe in zip(urls, probes, strict=True):
        if isinstance(probe, str):
            down.append(f"{desktop_name(url)} ({probe})")
            continue
        if len(pool) >= n:
            await probe.close()
            continue
        pool.append(probe)
    if down:
        log.warning("desktop servers left out (no answer): %s", ", ".join(down))
    start_here = min(local, n - len(pool))
    if start_here > 0:
        here = config.model_copy(update={"options": options})
        try:
            pool.extend(await open_local_desktops(here, start_here))
        except BaseException:
            await asyncio.gather(*(d.close() for d in pool), return_exceptions=True)
            raise
    if not pool and not token:
        raise ConfigError(
            f"no desktop server answered ({len(urls)} listed): {', '.join(down)}; legato "
            f"desktop servers need their token in the environment variable {token_env}"
        )
    if not pool:
        raise DesktopError(
            f"no desktop server answered ({len(urls)} listed): {', '.join(down)}", kind="crash"
        )
    return pool
