"""Waiting for a desktop attached by URL to come back (its host may restart), shared by
legato's own desktop servers and OSWorld VM servers attached by URL."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ..errors import DesktopError

log = logging.getLogger(__name__)

RECONNECT_INTERVAL_S = 0.5


async def reconnect(name: str, attempt: Callable[[], Awaitable[None]], reconnect_s: float) -> None:
    """Call ``attempt()`` (an async recovery step) until it succeeds or ``reconnect_s``
    seconds pass, every ``RECONNECT_INTERVAL_S``; then raise ``DesktopError(kind="crash")``:
    the desktop counts as lost. Shared by desktops attached by URL (legato servers and OSWorld
    VM servers), whose host may come back."""
    deadline = time.monotonic() + reconnect_s
    while True:
        try:
            await attempt()
            log.info("desktop %s recovered", name)
            return
        except DesktopError as exc:
            if time.monotonic() >= deadline:
                log.warning("desktop %s lost: %s", name, exc)
                raise DesktopError(
                    f"{name}: lost (no answer for {reconnect_s:g} s): {exc}", kind="crash"
                ) from None
        await asyncio.sleep(RECONNECT_INTERVAL_S)
