"""Whether an app's window shows its content yet: not blank, and the app done loading.

A mapped window is not a drawn one. Measured on local desktops (issue 33): Thunderbird's main
window is mapped black and stays black, then white with only its title bar, for seconds
(3 of 3 first observations on the osworld backend showed it blank or half-loaded; in a test
run here the policy's first keys went into a black window and the solved task scored 0);
Chromium blank at step 0 in 2 of 9 attempts; Calc's window undrawn after an action in 8 of
54 observations under load. The screen's drawing reports cannot tell: a window that draws
nothing is quiet. OSWorld's VM never shows it: its runner sleeps 60 s before the first
observation (docs/osworld.md §5).

Two signals, both cheap:

- :func:`blank`: a window's region in a frame is exactly one colour: what a mapped window
  shows before its first paint (Thunderbird's black). A window with any content is not: an
  xterm holding a prompt has its cursor and glyphs. One vectorized compare (~1 ms at
  1920×1080).
- :func:`busy_per_pid`: CPU time plus run-queue wait of the main threads of the processes
  that own the app's main windows (``/proc/PID/schedstat``), so a loading app reads busy even
  on a loaded machine where it gets little CPU. The main thread only: that is where a toolkit
  builds and paints the window (Thunderbird's front end loads there); work an app does in
  other threads meanwhile (GIMP loading its fonts) does not hold its window back. An app
  whose main threads were busy under :data:`IDLE_SHARE` of the time for
  :data:`IDLE_WINDOW_S` is done loading; the time counts from the start of the ready wait, so
  an app idle meanwhile costs nothing more. An app kept busy by its task (a video playing)
  is waited for :data:`LOADING_CAP_S` at most. Terminals and the editor are judged by
  blankness only (they paint at once).

Used by the desktop server's ready waits (:meth:`~.server_state.DesktopServer.wait_ready`).
"""

from __future__ import annotations

import numpy as np

IDLE_SHARE = 0.5  # busy seconds per second under which an app is done loading
IDLE_WINDOW_S = 0.3  # seconds of that idleness
LOADING_CAP_S = 10.0  # the longest wait for an app to stop loading (a video keeps VLC busy)
MIN_SIDE = 16  # px: smaller windows are not judged


def blank(frame: np.ndarray, x: int, y: int, width: int, height: int) -> bool:
    """Whether the window at ``x, y`` (root coordinates) of ``width`` × ``height`` px is exactly
    one colour in ``frame`` (``uint32`` pixels, height × width, as :meth:`.screen.Screen.frame`
    grabs). The part off screen is ignored; a window with less than :data:`MIN_SIDE` px on
    screen in either direction is never blank."""
    h, w = frame.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + width, w), min(y + height, h)
    if x1 - x0 < MIN_SIDE or y1 - y0 < MIN_SIDE:
        return False
    region = frame[y0:y1, x0:x1] & 0xFFFFFF  # the padding byte is not a colour
    return bool(np.all(region == region[0, 0]))


def busy_per_pid(pids: set[int]) -> dict[int, float]:
    """``{pid: seconds}`` its main thread has run or waited to run since it started (the
    kernel's ``/proc/PID/schedstat``: run time + run-queue wait, ns), for the processes of
    ``pids`` that still run (a kernel without schedstat: none, so never busy)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                run_ns, wait_ns, *_ = f.read().split()
        except (OSError, ValueError):
            continue
        out[pid] = (int(run_ns) + int(wait_ns)) / 1e9
    return out
