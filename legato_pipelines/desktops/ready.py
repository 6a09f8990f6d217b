"""The ready signal: wait until the screen stops changing, tolerant of a blinking caret.

One module for every desktop: the local desktop server runs it on its X frames
(``/legato/wait``); :class:`ScreenshotReady` runs it over a server's ``GET /screenshot`` for
desktops whose server has no ``/legato/wait`` (OSWorld's in-VM server: the ``osworld``
backend and VM servers attached by URL).

Method (docs/local-desktop.md §6): successive full-resolution uint32 frames are compared by the
number of changed pixels and their bounding box. A pair of frames is *quiet* when nothing
changed, or when at most 64 pixels changed inside a box at most 4 px wide and 40 px tall (a
caret blink; a typed glyph is wider). The screen is *ready* when the pairs of a whole stable
window are quiet: 3 x 50 ms after an action (ready after ~0.17 s for typing, the measured
floor), longer after a launch or reset of a heavy app (LibreOffice repaints its toolbars
~280 ms after its first full paint, so >= 0.5 s there). After a launch the screen must first
change, or a new window appear, before stability counts (else a cold LibreOffice is declared
ready before its window exists). Every wait is capped; ``ready_s`` is reported either way.

Two sources of "did the screen change", one decision loop (:func:`wait_until_ready`):

- frames: grab every ``interval_s`` (50 ms) and compare with the previous frame. Sampling has
  a floor of one stable window (3 pairs, ~0.15 s) because a change between two grabs is
  invisible until the next one.
- drawing reported by the X server (the DAMAGE extension, local desktops only:
  ``server/damage.py``): look every ``tick_s`` (20 ms) at what was drawn since the last look.
  Damage is exact (no sampling gap), so once something drew after the action the screen is
  ready after ``quiet_s`` without drawing (60 ms after an action, 150 ms while a heavy app
  runs: LibreOffice's idle timers repaint ~80 ms after its first answer); when nothing drew,
  the full ``stable_s`` applies, as with frames (an app may still be about to answer). A look
  that reports drawing grabs one frame to tell a real change from a redraw of the same
  pixels (only a real change counts as ``changed`` and arms a launch wait). No frame is
  compared at the end: damage misses no drawing, and the early-return share measured in
  BENCHMARKS.md (returned frame vs the frame 0.5 s later) is what checks the quiet windows.
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DesktopError

if TYPE_CHECKING:  # the desktop server imports this module and needs no task schemas (pydantic)
    from ..tasks import Task

#: Process names (``/proc/<pid>/comm``) of apps that need the longer stable window.
HEAVY_APPS = frozenset(
    {
        "soffice.bin",
        "oosplash",
        "chrome",
        "chromium",
        "gimp-2.10",
        "gimp",
        "thunderbird",
        "code",
        "vlc",
    }
)


@dataclass(frozen=True, slots=True)
class ReadyPolicy:
    """How to wait for a stable screen.

    interval_s      seconds between frames
    stable_s        seconds of quiet frame pairs that count as ready
    timeout_s       cap: give up and report ``timed_out`` after this many seconds
    require_change  first wait for a change against the reference frame, or a new window
    blink_px, blink_w, blink_h   the caret tolerance (changed pixels, box width, box height)
    tick_s          seconds between looks at the X server's damage reports (damage path)
    quiet_s         damage path: seconds without drawing that count as ready once something
                    drew during the wait (else ``stable_s`` applies)
    """

    interval_s: float = 0.05
    stable_s: float = 0.15
    timeout_s: float = 5.0
    require_change: bool = False
    blink_px: int = 64
    blink_w: int = 4
    blink_h: int = 40
    tick_s: float = 0.02
    quiet_s: float = 0.06

    @property
    def stable_pairs(self) -> int:
        """Quiet frame pairs in a row that count as ready (frame path)."""
        return _looks(self.stable_s, self.interval_s)

    def quiet_looks(self, drew: bool) -> int:
        """Quiet damage looks in a row that count as ready (damage path): ``quiet_s`` once
        something drew during the wait, else ``stable_s``."""
        return _looks(self.quiet_s if drew else max(self.stable_s, self.quiet_s), self.tick_s)


def _looks(window_s: float, every_s: float) -> int:
    return max(1, math.ceil(window_s / every_s - 1e-9))


#: Defaults per wait mode. ``launch``/``reset`` require a change only when a launch is pending.
MODES: dict[str, ReadyPolicy] = {
    "action": ReadyPolicy(),
    "eval": ReadyPolicy(stable_s=0.25, quiet_s=0.1),
    "launch": ReadyPolicy(stable_s=0.2, timeout_s=10.0, quiet_s=0.1),
    "reset": ReadyPolicy(stable_s=0.2, timeout_s=10.0, quiet_s=0.1),
}
HEAVY_STABLE_S = 0.5
#: Damage path, after an action or before grading while a heavy app runs: LibreOffice Calc
#: draws the typed text at once, then nothing for 70-110 ms, then its toolbar and status
#: updates (its idle timers; measured with DAMAGE timestamps), so 0.06 s returned early on
#: 14 of 30 typed cells.
HEAVY_QUIET_S = 0.15


def policy_for(
    mode: str, *, heavy: bool = False, launch_pending: bool = False, **overrides
) -> ReadyPolicy:
    """The policy of a wait ``mode`` (``action``, ``eval``, ``launch``, ``reset``).

    ``heavy``: a heavy app runs, so launch/reset use a stable (and quiet) window of at least
    0.5 s: LibreOffice draws nothing for ~280 ms between its first paint and its toolbars;
    action/eval use a quiet window of at least :data:`HEAVY_QUIET_S`.
    ``launch_pending``: an app was launched and has not shown yet (launch/reset only).
    ``overrides``: fields of :class:`ReadyPolicy` (``None`` values are ignored); a
    ``stable_s`` given without ``quiet_s`` sets both (the caller asked for that window).
    Raises ``ValueError`` for an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"unknown wait mode {mode!r}; use one of {sorted(MODES)}")
    policy = MODES[mode]
    if mode in ("launch", "reset"):
        if heavy:
            policy = replace(
                policy,
                stable_s=max(policy.stable_s, HEAVY_STABLE_S),
                quiet_s=max(policy.quiet_s, HEAVY_STABLE_S),
            )
        policy = replace(policy, require_change=launch_pending)
    elif heavy:
        policy = replace(policy, quiet_s=max(policy.quiet_s, HEAVY_QUIET_S))
    given = {k: v for k, v in overrides.items() if v is not None}
    if "stable_s" in given and "quiet_s" not in given:
        given["quiet_s"] = given["stable_s"]
    return replace(policy, **given)


@dataclass(frozen=True, slots=True)
class Delta:
    """How two frames differ: changed pixel count and bounding box ``(x0, y0, x1, y1)``
    (exclusive ends), ``None`` when nothing changed or the box was not needed."""

    changed: int
    bbox: tuple[int, int, int, int] | None = None


def frame_delta(a: np.ndarray, b: np.ndarray, *, bbox_limit: int = 64) -> Delta:
    """Compare two ``(h, w)`` uint32 frames. The box is computed only when at most
    ``bbox_limit`` pixels changed (the caret test needs it; larger changes are changes)."""
    if a.shape != b.shape:
        return Delta(changed=a.size)
    diff = a != b
    changed = int(np.count_nonzero(diff))
    if changed == 0 or changed > bbox_limit:
        return Delta(changed)
    ys, xs = np.nonzero(diff)
    return Delta(changed, (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1))


def is_quiet(delta: Delta, policy: ReadyPolicy) -> bool:
    """True for no change, or a caret-sized one (see :class:`ReadyPolicy`)."""
    if delta.changed == 0:
        return True
    if delta.changed > policy.blink_px or delta.bbox is None:
        return False
    x0, y0, x1, y1 = delta.bbox
    return (x1 - x0) <= policy.blink_w and (y1 - y0) <= policy.blink_h


@dataclass(frozen=True, slots=True)
class ReadyResult:
    """``ready_s``: seconds from the start of the wait until ready (or the cap);
    ``frames``: frames grabbed; ``changed``: the screen changed during the wait;
    ``timed_out``: the cap was hit; ``source``: what it watched, ``damage`` (the X server's
    drawing reports) or ``poll`` (frames); ``quiet_s``: seconds of quiet the wait ended with
    (its last run of quiet looks, counting any ``quiet_before_s`` credit; 0 on a timeout), for
    the caller's next credit (not on the wire); ``undrawn``: the wait ended (at its cap) with an
    app's window still blank or the app still loading (the desktop server's content wait:
    ``desktops/server/drawn.py``), so the screen handed out next shows it undrawn."""

    ready_s: float
    frames: int
    changed: bool
    timed_out: bool
    source: str = "poll"
    quiet_s: float = 0.0
    undrawn: bool = False

    def to_json(self) -> dict:
        return {
            "ready_s": self.ready_s,
            "frames": self.frames,
            "changed": self.changed,
            "timed_out": self.timed_out,
            "source": self.source,
            "undrawn": self.undrawn,
        }


@dataclass(frozen=True, slots=True)
class Activity:
    """What the X server reported drawn since the previous look: ``delta`` (``changed`` = the
    area of the damaged box in pixels, ``bbox`` = that box ``(x0, y0, x1, y1)``, so the caret
    rule of :func:`is_quiet` applies to it) and ``mapped`` (a window was mapped)."""

    delta: Delta
    mapped: bool = False


class _Frames:
    """The frame source: every look grabs a frame and compares it with the previous one."""

    def __init__(self, grab: Callable[[], Awaitable[np.ndarray]], first: np.ndarray):
        self.grab, self.previous, self.frames = grab, first, 1

    async def look(self, policy: ReadyPolicy) -> tuple[bool, bool]:
        """``(quiet, changed)`` of the screen since the previous look."""
        current = await self.grab()
        self.frames += 1
        quiet = is_quiet(frame_delta(self.previous, current), policy)
        self.previous = current
        return quiet, not quiet

    def looks_needed(self, policy: ReadyPolicy, drew: bool) -> int:
        return policy.stable_pairs


class _Damage(_Frames):
    """The damage source: every look asks what was drawn; drawing (beyond a caret, or a window
    mapped) is not quiet, and grabs a frame to tell whether the pixels really changed."""

    def __init__(self, activity: Callable[[], Awaitable[Activity]], grab, first: np.ndarray):
        super().__init__(grab, first)
        self.activity = activity

    async def look(self, policy: ReadyPolicy) -> tuple[bool, bool]:
        seen = await self.activity()
        if is_quiet(seen.delta, policy) and not seen.mapped:
            return True, False
        _, changed = await super().look(policy)
        return False, changed

    def looks_needed(self, policy: ReadyPolicy, drew: bool) -> int:
        return policy.quiet_looks(drew)


async def wait_until_ready(
    grab: Callable[[], Awaitable[np.ndarray]],
    policy: ReadyPolicy,
    *,
    reference: np.ndarray | None = None,
    new_window: Callable[[], Awaitable[bool]] | None = None,
    activity: Callable[[], Awaitable[Activity]] | None = None,
    quiet_before_s: float = 0.0,
    on_look: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> ReadyResult:
    """Wait until the screen is quiet for a whole window; one loop for both sources.

    Without ``activity`` (frame path): grab frames every ``policy.interval_s`` until
    ``policy.stable_pairs`` quiet pairs in a row. With ``activity`` (damage path: what the X
    server reported drawn since the previous call; the first call reports what was drawn
    since the caller last cleared it, e.g. since the action): look every ``policy.tick_s``
    until :meth:`ReadyPolicy.quiet_looks` quiet looks in a row.

    ``reference``: the screen before the action or launch; ``changed`` reports whether the
    screen differs from it (or changed during the wait). With ``policy.require_change``, quiet
    looks count only once a frame differs (not quietly) from ``reference`` or ``new_window()``
    returns True. Never raises on timeout: returns ``timed_out=True`` with ``ready_s`` = the cap.

    ``quiet_before_s`` (damage path only): seconds the screen is known to have been quiet
    before this wait, from the end of the previous wait, whose last look cleared the reports,
    to now (the caller vouches that nothing since could draw later: no input, no launch). The
    first look then comes at once and reports everything drawn in that gap; when it is quiet
    the credit counts as quiet looks, so a screen quiet for the whole window is ready without
    sleeping a new one. Drawing in the gap voids the credit.

    ``on_look(quiet, needed)``: called after every armed look with the quiet looks in a row
    and the looks that count as ready (the desktop server prepares the next observation
    half-way through the window: :mod:`.local.prepared_obs`).
    """
    start = clock()
    first = await grab()
    looker = _Frames(grab, first) if activity is None else _Damage(activity, grab, first)
    every_s, source = (policy.interval_s, "poll") if activity is None else (policy.tick_s, "damage")
    changed = drew = False
    armed = not policy.require_change
    if reference is not None and not is_quiet(frame_delta(reference, first), policy):
        armed = changed = drew = True
    quiet = 0
    credit = int(quiet_before_s / every_s + 1e-9) if activity is not None else 0
    while True:
        if clock() - start >= policy.timeout_s:
            return ReadyResult(clock() - start, looker.frames, changed, True, source)
        if credit:
            credit_looks, credit = credit, 0  # the first look covers the gap: no sleep
        else:
            credit_looks = 0
            await sleep(every_s)
        still, moved = await looker.look(policy)
        if still:
            quiet += max(credit_looks, 1)
        else:
            quiet, drew = 0, True
        if moved:
            changed = armed = True
        if not armed and new_window is not None and (not still or activity is None):
            if await new_window():
                armed, quiet = True, 0
        needed = looker.looks_needed(policy, drew)
        if armed and on_look is not None:
            on_look(quiet, needed)
        if armed and quiet >= needed:
            return ReadyResult(
                clock() - start, looker.frames, changed, False, source, quiet * every_s
            )


# -- over a server's GET /screenshot ----------------------------------------------------------

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
    (``reset`` | ``action`` | ``eval``). After a reset whose setup launched or opened an app,
    the screen must first differ from the clean desktop (the app showed) before stability
    counts; domains of heavy apps get the 0.5 s stable window.
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
        self._last_png = None
        try:
            self._blank = await self.grab_frame()
        except DesktopError:
            self._blank = None

    def prepare(self, task: Task) -> None:
        """Note whether ``task``'s setup launches an app and whether its domain is heavy."""
        self._launching = any(step.get("type") in LAUNCH_STEPS for step in task.setup)
        self._heavy = task.domain in HEAVY_DOMAINS

    async def wait(self, mode: str, **overrides: float | None) -> ReadyResult:
        """Poll until the screen is stable (:func:`wait_until_ready`); never raises on its cap
        (``timed_out``), only ``DesktopError`` from ``fetch``. ``overrides``: fields of
        :class:`ReadyPolicy` (``timeout_s``: the cap)."""
        reference = None
        if mode == "reset":
            pending = self._launching and self._blank is not None
            policy = policy_for(mode, heavy=self._heavy, launch_pending=pending, **overrides)
            reference = self._blank if pending else None
        else:
            policy = policy_for(mode, **overrides)
        return await wait_until_ready(self.grab_frame, policy, reference=reference)
