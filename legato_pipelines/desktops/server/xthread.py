"""The one thread that talks to the X server, and the connections it owns.

Xlib and mss connections are not thread-safe, and Xvfb/openbox get a parent-death signal
tied to the thread that spawned them, so every X call and every (re)start of the display
runs on one long-lived worker thread. The connections are reopened when the session's
display generation changes (after a full restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from Xlib.display import Display

from .damage import Damage, DamageUnavailable
from .hotkeys import HotkeyUnavailable, TerminalHotkey
from .input import Input
from .screen import Screen
from .session import Session
from .windows import Windows
from .xstate import watch

T = TypeVar("T")
log = logging.getLogger("legato_pipelines.desktops.server")


@dataclass
class XContext:
    """The connections of one display generation: Xlib (windows, input), mss (screen),
    the drawing reports (``damage``; ``None`` when the X server has no DAMAGE extension),
    the Ctrl+Alt+T grab (``hotkey``; ``None`` when it cannot be grabbed: :mod:`.hotkeys`) and
    the X server's state (``state``: a connection of its own, as :mod:`.xstate` announces XKB
    on it, after which the server sends it no core ``MappingNotify``, which :mod:`.input`
    needs on ``display``)."""

    generation: int
    display: Display
    windows: Windows
    input: Input
    screen: Screen
    damage: Damage | None
    hotkey: TerminalHotkey | None
    state: Display

    @classmethod
    def open(cls, session: Session) -> XContext:
        display = Display(session.display)
        windows = Windows(display)
        try:
            reports: Damage | None = Damage(session.display)
        except DamageUnavailable:
            reports = None
        try:
            hotkey: TerminalHotkey | None = TerminalHotkey(session.display)
        except HotkeyUnavailable as exc:
            log.warning("%s: Ctrl+Alt+T opens no terminal", exc)
            hotkey = None
        state = Display(session.display)
        watch(state)
        return cls(
            session.generation,
            display,
            windows,
            Input(display, windows),
            Screen(session.display),
            reports,
            hotkey,
            state,
        )

    def check_alive(self) -> None:
        """One round trip on every connection (a client inside can ``KillClient`` any of
        them, found with X-Resource). Raises ``ConnectionError`` naming the first one the X
        server closed, so the reset falls back to a full restart that opens them anew."""
        checks = {
            "xlib": self.display.sync,
            "state": self.state.sync,
            "screen": self.screen.check_alive,
        }
        if self.damage is not None:
            checks["damage"] = self.damage.check_alive
        if self.hotkey is not None:
            checks["hotkey"] = self.hotkey.check_alive
        for name, check in checks.items():
            try:
                check()
            except Exception as exc:
                raise ConnectionError(
                    f"the desktop server's {name} connection to the X server is gone: {exc!r}"
                ) from None

    def close(self) -> None:
        closers = [self.screen.close, self.display.close, self.state.close]
        if self.damage is not None:
            closers.append(self.damage.close)
        if self.hotkey is not None:
            closers.append(self.hotkey.close)
        for close in closers:
            try:
                close()
            except Exception:  # the X server may already be gone
                pass


class XThread:
    """Runs functions on the X thread; ``ctx()`` (inside them) is the current connection set."""

    def __init__(self, session: Session):
        self.session = session
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="legato-x")
        self._ctx: XContext | None = None

    async def run(self, fn: Callable[..., T], *args) -> T:
        """Run ``fn(*args)`` on the X thread and return its result (exceptions propagate)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def ctx(self) -> XContext:
        """The X connections for the session's current display (X thread only)."""
        if self._ctx is None or self._ctx.generation != self.session.generation:
            if self._ctx is not None:
                self._ctx.close()
            self._ctx = XContext.open(self.session)
        return self._ctx

    def drop_ctx(self) -> None:
        """Close the connections (before the display is stopped; X thread only)."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
