"""Screen grabs with mss over MIT-SHM: raw frames for the ready signal, PNG for observations.

A raw 1080p grab with ``xshmgetimage`` takes ~1.4 ms; PNG encoding dominates an observation
(``mss.tools.to_png`` at zlib level 1: ~25 ms and ~100 KB at 1080p, vs ~38 ms at level 6;
docs/local-desktop.md §4), so each observation is encoded exactly once. Observations include the
mouse cursor (as OSWorld's screenshots do); ready-signal frames do not, so a parked pointer
never counts as a change.

At the model's size (``/legato/observe?width=&height=``) an observation is grabbed raw and
resized here, by :func:`~legato_pipelines.images.resized_png` (the collector's own resize),
off the X thread: one encode of the smaller image in this server's process, and no decode,
resize or encode on the collector.
"""

from __future__ import annotations

import mss
import mss.tools
import numpy as np
from mss.linux import xcb

from ...images import resized_png

PNG_LEVEL = 1


class Screen:
    """Grabs of one X display. Use from one thread (the server's X thread)."""

    def __init__(self, display: str):
        self._frames = mss.MSS(display=display, backend="xshmgetimage", with_cursor=False)
        self._shots = mss.MSS(display=display, backend="xshmgetimage", with_cursor=True)
        self.monitor = dict(self._frames.monitors[0])
        self.size = (int(self.monitor["width"]), int(self.monitor["height"]))

    def frame(self) -> np.ndarray:
        """The screen as a ``(height, width)`` uint32 array (BGRX pixels), without the cursor."""
        shot = self._frames.grab(self.monitor)
        width, height = self.size
        # ``raw`` is a fresh bytearray per grab: no copy needed.
        return np.frombuffer(shot.raw, dtype=np.uint32).reshape(height, width)

    def png(self) -> bytes:
        """The screen (with the cursor) as PNG bytes, zlib level 1."""
        shot = self._shots.grab(self.monitor)
        return mss.tools.to_png(shot.rgb, shot.size, level=PNG_LEVEL)

    def grab(self) -> tuple[bytes, tuple[int, int]]:
        """The screen (with the cursor) raw: (BGRX bytes, (width, height)); see :func:`model_png`."""
        shot = self._shots.grab(self.monitor)
        return shot.raw, (int(shot.width), int(shot.height))

    def check_alive(self) -> None:
        """A round trip (``GetGeometry`` of the root) on each of mss's connections (its
        Linux backend's xcb connection, ``_impl``: mss has no public call for it); raises
        (mss's ``ScreenShotError``) when the X server closed one."""
        for sct in (self._frames, self._shots):
            impl = sct._impl
            xcb.get_geometry(impl.conn, impl.root)

    def close(self) -> None:
        for sct in (self._frames, self._shots):
            sct.close()


def model_png(raw: bytes, screen: tuple[int, int], size: tuple[int, int]) -> bytes:
    """A raw grab (:meth:`Screen.grab`) as the PNG the model is sent: resized from ``screen``
    to ``size`` (both (width, height)) exactly as the collector would resize the screen's own
    PNG (same RGB pixels in, :func:`~legato_pipelines.images.resized_png`). Thread-safe;
    Pillow releases the GIL while it works."""
    from PIL import Image

    image = Image.frombuffer("RGB", screen, raw, "raw", "BGRX", 0, 1)
    return resized_png(image, size)
