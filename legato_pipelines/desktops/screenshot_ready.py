"""The ready signal over a server's ``GET /screenshot``: poll PNG screenshots until stable.

For desktops whose server has no ``/legato/wait`` (OSWorld's in-VM server): the ``osworld``
backend and VM servers attached by URL (``desktops/vmserver.py``). Frames are compared with
the local desktop's frame-diff rules (:mod:`.local.ready`: caret-tolerant, capped). After a
reset whose setup launched or opened an app, the screen must first differ from the clean
desktop (the app showed) before stability counts; domains of heavy apps get the 0.5 s
stable window.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable

import numpy as np

from ..tasks import Task
from .local.ready import ReadyResult, policy_for, wait_until_ready

#: Setup steps that start an app (docs/osworld.md §3): the reset wait first waits for it to show.
LAUNCH_STEPS = frozenset({"launch", "open", "chrome_open_tabs"})
#: Domains of apps that repaint for a while after their first paint (the 0.5 s window).
HEAVY_DOMAINS = frozenset(
    {
        "chrome",
        "gimp",
        "libreoffice_calc",
        "libreoffice_impress",
        "libreoffice_writer",
        "thunderbird",
        "vlc",
        "vs_code",
        "multi_apps",
    }
)


def png_frame(png: bytes) -> np.ndarray:
    """A PNG as an ``(h, w)`` uint32 frame (RGBA packed), the ready signal's unit."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        rgba = np.ascontiguousarray(np.asarray(img.convert("RGBA")))
    return rgba.view(np.uint32).reshape(rgba.shape[:2])


class ScreenshotReady:
    """Ready waits of one desktop from ``fetch()`` (PNG bytes of ``GET /screenshot``; it raises
    ``DesktopError`` when the server does not answer, which the waits pass on).

    Per attempt: :meth:`capture_blank` once on the clean desktop (at start), :meth:`prepare`
    with the task before its reset wait, then :meth:`wait` per mode
    (``reset`` | ``action`` | ``eval``).
    """

    def __init__(self, fetch: Callable[[], Awaitable[bytes]]):
        self._fetch = fetch
        self._last_png: tuple[bytes, np.ndarray] | None = None
        self._blank: np.ndarray | None = None
        self._launching = self._heavy = False

    async def grab_frame(self) -> np.ndarray:
        """One frame, decoded off the event loop (not at all when the PNG bytes equal the
        previous frame's)."""
        png = await self._fetch()
        if self._last_png is not None and png == self._last_png[0]:
            return self._last_png[1]  # same bytes, same frame: skip the decode
        frame = await asyncio.to_thread(png_frame, png)
        self._last_png = (png, frame)
        return frame

    async def capture_blank(self) -> None:
        """Remember the clean desktop (a failed grab leaves no reference: no launch wait)."""
        from ..errors import DesktopError

        self._last_png = None
        try:
            self._blank = await self.grab_frame()
        except DesktopError:
            self._blank = None

    def prepare(self, task: Task) -> None:
        """Note whether ``task``'s setup launches an app and whether its domain is heavy."""
        self._launching = any(step.get("type") in LAUNCH_STEPS for step in task.setup)
        self._heavy = task.domain in HEAVY_DOMAINS

    async def wait(self, mode: str) -> ReadyResult:
        """Poll until the screen is stable (:func:`~.local.ready.wait_until_ready`); never
        raises on its cap (``timed_out``), only ``DesktopError`` from ``fetch``."""
        reference = None
        if mode == "reset":
            pending = self._launching and self._blank is not None
            policy = policy_for(mode, heavy=self._heavy, launch_pending=pending)
            reference = self._blank if pending else None
        else:
            policy = policy_for(mode)
        return await wait_until_ready(self.grab_frame, policy, reference=reference)
