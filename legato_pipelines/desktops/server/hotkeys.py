"""GNOME's Ctrl+Alt+T on a local desktop: the key combination, grabbed on the root window.

OSWorld's VM is an Ubuntu GNOME session, where Ctrl+Alt+T opens a terminal; OSWorld's ``os``
tasks expect the agent to open one that way (their setups open none). A local desktop runs
openbox, which has no such binding, and a binding in openbox would start the terminal outside
the desktop's sandbox (openbox runs on the host). So the desktop server grabs the combination
itself (``XGrabKey`` on the root window, on a connection of its own) and launches the
terminal the way ``/setup/launch`` launches apps (``DesktopServer.launch_terminal``): as the
desktop user, with the task's environment and session bus, inside the sandbox.

The grab catches every key press the X server delivers, whether from a real keyboard or XTest:
the server's own input path (``/legato/act``) and pyautogui's ``hotkey('ctrl', 'alt', 't')``
run by OSWorld's commands through ``/execute`` are both XTest. One grab per combination of the
lock modifiers (Caps Lock, Num Lock = Mod2, Scroll Lock = Mod5), as GNOME's key grabber does:
X matches a passive grab's modifiers exactly. While the grab is active the focused window does
not get the key, as under GNOME. Use on one thread (the server's X thread, :mod:`.xthread`).
"""

from __future__ import annotations

import itertools

from Xlib import XK, X
from Xlib.display import Display
from Xlib.error import CatchError

#: Modifiers of the combination: Ctrl+Alt (Alt is Mod1 in Xvfb's and Debian's keymaps).
MODIFIERS = X.ControlMask | X.Mod1Mask
#: The lock modifiers a grab must ignore (Caps Lock, Num Lock, Scroll Lock).
LOCK_MASKS = (X.LockMask, X.Mod2Mask, X.Mod5Mask)
KEYSYM = XK.XK_t


class TerminalHotkey:
    """Ctrl+Alt+T grabbed on the root window of ``display`` (e.g. ``":5"``).

    Raises :class:`HotkeyUnavailable` when the key cannot be grabbed (the keymap has no ``t``,
    or another client, e.g. a window manager binding, holds the combination already)."""

    def __init__(self, display: str):
        self._display = Display(display)
        try:
            self._keycode = self._display.keysym_to_keycode(KEYSYM)
            if not self._keycode:
                raise HotkeyUnavailable(f"the keymap of {display} has no 't' key")
            root = self._display.screen().root
            failed = CatchError()
            for extra in _lock_combinations():
                root.grab_key(
                    self._keycode,
                    MODIFIERS | extra,
                    False,
                    X.GrabModeAsync,
                    X.GrabModeAsync,
                    onerror=failed,
                )
            self._display.sync()
            if failed.get_error() is not None:
                raise HotkeyUnavailable(
                    f"Ctrl+Alt+T is grabbed by another client on {display} "
                    "(a window manager key binding?): remove that binding"
                )
        except BaseException:
            self._display.close()
            raise

    def take(self) -> int:
        """How many times Ctrl+Alt+T was pressed since the previous call (or since the grab);
        reads the connection's queued events without blocking."""
        presses = 0
        while self._display.pending_events():
            event = self._display.next_event()
            if event.type == X.KeyPress and event.detail == self._keycode:
                presses += 1
        return presses

    def check_alive(self) -> None:
        """A round trip; raises (python-xlib's ``ConnectionClosedError``) when the X server
        closed the connection. Presses it queues stay for :meth:`take`."""
        self._display.sync()

    def close(self) -> None:
        """Drop the grab (with the connection)."""
        self._display.close()


def _lock_combinations() -> list[int]:
    """Every subset of :data:`LOCK_MASKS` OR-ed together (8 masks, 0 first)."""
    return [
        sum(combo)
        for n in range(len(LOCK_MASKS) + 1)
        for combo in itertools.combinations(LOCK_MASKS, n)
    ]


class HotkeyUnavailable(RuntimeError):
    """Ctrl+Alt+T cannot be grabbed on this display: the desktop has no terminal key."""
