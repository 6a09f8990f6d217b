"""What the X server drew: the DAMAGE extension on the root window, for the ready signal.

A damage object on the root window reports drawing into any window of the screen (Xvfb has
no compositor, so every window draws into the root's framebuffer; the software cursor is not
reported). It uses ``DamageReportBoundingBox``: the server sends an event only when the box of
the damage collected since the last :meth:`Damage.take` grows, so a busy app between two waits
queues a handful of events, not one per drawing. ``take`` reads them, clears the damage
(``DamageSubtract``) and answers the box as an :class:`~legato_pipelines.desktops.ready.Activity`;
``SubstructureNotify`` on the root adds whether a top-level window was mapped.

Measured on Xvfb (docs/local-desktop.md §6): an xterm printing a line damages its text cells
(6x13 px per glyph); moving the pointer damages nothing; a mapped window damages its area.
The connection is its own (events never mix with the windows' and input's connection) and is
used only on the server's X thread, like the others (:mod:`.xthread`).
"""

from __future__ import annotations

from Xlib import X
from Xlib.display import Display
from Xlib.ext import damage, xfixes

from ..ready import Activity, Delta


class Damage:
    """Drawing reports of one X display; use from one thread (the server's X thread)."""

    def __init__(self, display: str):
        """Open a connection to ``display`` (e.g. ``":5"``) and subscribe. Raises
        :class:`DamageUnavailable` when the server has no DAMAGE extension (use polling)."""
        self._display = Display(display)
        try:
            if not self._display.has_extension(damage.extname):
                raise DamageUnavailable(f"the X server on {display} has no DAMAGE extension")
            self._display.damage_query_version()
            root = self._display.screen().root
            self._damage = root.damage_create(damage.DamageReportBoundingBox)
            root.change_attributes(event_mask=X.SubstructureNotifyMask)
            self._notify = self._display.extension_event.DamageNotify
            #: the pointer's image changes are reported too (:meth:`pending`, and counted in
            #: :attr:`cursor_changes` by :meth:`take`); not where the X server has no XFIXES
            self.cursor_reports = self._display.has_extension(xfixes.extname)
            #: XFixes cursor notices :meth:`take` read so far (their drawing is no damage, so
            #: the :class:`Activity` it answers does not show them)
            self.cursor_changes = 0
            self._cursor_notify = None
            if self.cursor_reports:
                self._display.xfixes_query_version()
                self._display.xfixes_select_cursor_input(root, xfixes.XFixesDisplayCursorNotifyMask)
                self._cursor_notify = self._display.extension_event.DisplayCursorNotify[0]
            self._display.sync()
        except BaseException:
            self._display.close()
            raise

    def take(self) -> Activity:
        """What was drawn since the previous call (or since the connection opened): the box
        of the damage (``Delta.changed`` = its area in pixels) and whether a window mapped.
        Clears the damage, so the next call reports only newer drawing. Cursor notices read
        here count in :attr:`cursor_changes`."""
        box: tuple[int, int, int, int] | None = None
        mapped = False
        while self._display.pending_events():
            event = self._display.next_event()
            if event.type == self._notify:
                a = event.area  # with BoundingBox, the latest event holds the whole box
                box = (a.x, a.y, a.x + a.width, a.y + a.height)
            elif event.type == X.MapNotify:
                mapped = True
            elif event.type == self._cursor_notify:
                self.cursor_changes += 1
        if box is None:
            return Activity(Delta(0), mapped)
        self._display.damage_subtract(self._damage)
        self._display.flush()
        area = (box[2] - box[0]) * (box[3] - box[1])
        return Activity(Delta(max(area, 1), box), mapped)

    def pending(self) -> bool:
        """Whether anything was drawn, mapped or the pointer's image changed since the last
        :meth:`take` (after a round trip, so every report the X server sent before it is in;
        the reports stay queued for the next ``take``). Always True without cursor reports:
        an unchanged screen cannot be vouched for then."""
        self._display.sync()
        return not self.cursor_reports or self._display.pending_events() > 0

    def check_alive(self) -> None:
        """A round trip; raises (python-xlib's ``ConnectionClosedError``) when the X server
        closed the connection. The reports it queues stay for :meth:`take`."""
        self._display.sync()

    def close(self) -> None:
        self._display.close()


class DamageUnavailable(RuntimeError):
    """The X server cannot report drawing (no DAMAGE extension): the ready wait polls frames."""
