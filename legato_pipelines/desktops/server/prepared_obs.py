"""The next observation, grabbed and encoded while a ready wait's quiet window runs out.

After every action the collector waits for a quiet screen (``/legato/wait``) and then asks for
the observation (``/legato/observe?width=&height=``): a grab, a resize to the model's size and
a PNG encode, ~15 ms of CPU at 1280x720 and 40-60 ms of wall on a loaded 2-core machine, all
on the attempt's critical path (issue 18). The screen cannot change unseen during the wait's
last quiet looks, so the server grabs it half-way through the quiet window and encodes it
while the window runs out; ``observe`` then answers that PNG when nothing changed since the
grab:

- no drawing at all since the grab, not even a caret blink: every look of the wait after the
  grab reported nothing drawn (:meth:`PreparedObservations.seen`), and at ``observe`` no
  drawing report is pending on the damage connection after a round trip to the X server
  (``Damage.pending``);
- the pointer is where it was at the grab and its image has not changed (an observation shows
  the cursor, as OSWorld's do; XFixes cursor notices arrive on the damage connection: none
  pending, and none read by the wait's looks since the grab, ``Damage.cursor_changes``);
- the display is the one grabbed (the same damage connection: no full restart since);
- no request but a read came between the wait and ``observe`` (``server.guarded`` calls
  :meth:`PreparedObservations.drop`), and the model size asked for is the one prepared (the
  size of the previous ``observe``).

Anything else, and ``observe`` grabs the screen as before. A prepared grab is used once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..ready import Activity
from .screen import model_png
from .xthread import XThread


@dataclass
class Prepared:
    """One speculative observation: the model ``size`` (width, height) it was made for and the
    task making ``(png, screen size, marks)``, sizes in pixels; ``marks``: what :meth:`take`
    compares with the screen now (the damage connection, its cursor notices read and the
    pointer position at the grab)."""

    size: tuple[int, int]
    made: asyncio.Task


class PreparedObservations:
    """The prepared observation of one desktop server (event loop side; X calls go through
    ``x``, the server's X thread)."""

    def __init__(self, x: XThread):
        self.x = x
        #: the model size of the last ``observe`` that asked for one: the size to prepare
        self.size: tuple[int, int] | None = None
        self.current: Prepared | None = None

    def drop(self) -> None:
        """Forget the prepared observation (an action, a reset, any request but a read)."""
        self.current = None

    def seen(self, activity: Activity) -> None:
        """A look of a ready wait: any drawing (even a caret) or mapped window since the
        previous look makes the prepared grab stale."""
        if activity.delta.changed or activity.mapped:
            self.current = None

    def on_look(self, quiet: int, needed: int) -> None:
        """After each look of a damage wait (``quiet`` looks in a row of ``needed``): half-way
        through the quiet window, grab the screen and start encoding it (once per window)."""
        if self.size is None or self.current is not None or quiet < max(1, needed // 2):
            return
        size = self.size

        def grab() -> tuple[bytes, tuple[int, int], tuple]:
            ctx = self.x.ctx()
            raw, screen = ctx.screen.grab()
            pointer = ctx.display.screen().root.query_pointer()
            cursor = ctx.damage.cursor_changes if ctx.damage is not None else None
            return raw, screen, (ctx.damage, cursor, (pointer.root_x, pointer.root_y))

        async def make() -> tuple[bytes, tuple[int, int], tuple]:
            raw, screen, marks = await self.x.run(grab)
            return await asyncio.to_thread(model_png, raw, screen, size), screen, marks

        made = asyncio.get_running_loop().create_task(make())
        made.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "unretrieved"
        self.current = Prepared(size, made)

    async def take(self, size: tuple[int, int]) -> tuple[bytes, tuple[int, int]] | None:
        """The prepared ``(png, screen size)`` for model ``size`` when the screen is unchanged
        since its grab (module docs), else ``None``; either way nothing stays prepared, and
        ``size`` is the one the next wait prepares."""
        self.size = size
        prepared, self.current = self.current, None
        if prepared is None or prepared.size != size:
            return None
        try:
            png, screen, (damage, cursor, pointer) = await prepared.made
        except Exception:  # the display went away meanwhile: grab as usual (and fail there)
            return None

        def unchanged() -> bool:
            ctx = self.x.ctx()
            if ctx.damage is None or ctx.damage is not damage or ctx.damage.pending():
                return False
            if ctx.damage.cursor_changes != cursor:  # read by a look since the grab
                return False
            now = ctx.display.screen().root.query_pointer()
            return (now.root_x, now.root_y) == pointer

        if not await self.x.run(unchanged):
            return None
        return png, screen
