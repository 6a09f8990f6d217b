"""Screen grabs with mss over MIT-SHM: raw frames for the ready signal, PNG for observations.

A raw 1080p grab with ``xshmgetimage`` takes ~1.4 ms; PNG encoding dominates an observation
(``mss.tools.to_png`` at zlib level 1: ~25 ms and ~100 KB at 1080p, vs ~38 ms at level 6;
docs/local-desktop.md §4), so each observation is encoded exactly once. Observations include the
mouse cursor (as OSWorld's screenshots do); ready-signal frames do not, so a parked pointer
never counts as a change.
"""

from __future__ import annotations

import mss
import mss.tools
import numpy as np

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

    def close(self) -> None:
        for sct in (self._frames, self._shots):
            sct.close()
