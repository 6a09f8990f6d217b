"""Top-level windows through EWMH (the window manager's ``_NET_*`` properties), python-xlib.

Used for focus repair before keystrokes, ``/setup/activate_window`` and ``/setup/close_window``
(wmctrl ``-a``/``-c`` semantics without a process per call), ``/setup/open_file`` (wait for a
window whose title names the file), the launch ready signal ("a new window appeared") and
the minimal ``/accessibility`` tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

from Xlib import X, Xatom
from Xlib.display import Display
from Xlib.protocol import event
from Xlib.xobject.drawable import Window

from . import vm_windows

FOCUS_TIMEOUT_S = 0.25


@dataclass(frozen=True, slots=True)
class WindowInfo:
    """A managed top-level window: X id, title, WM_CLASS (instance, class), geometry."""

    id: int
    title: str
    wm_class: tuple[str, str]
    x: int
    y: int
    width: int
    height: int


class Windows:
    """EWMH queries and requests on one display connection (X thread only)."""

    def __init__(self, display: Display):
        self.d = display
        self.root = display.screen().root
        self._atoms: dict[str, int] = {}
        #: managed windows of type ``DOCK`` by id (the ``vm`` session's panels): not clients
        self._docks: dict[int, bool] = {}

    def atom(self, name: str) -> int:
        if name not in self._atoms:
            self._atoms[name] = self.d.intern_atom(name)
        return self._atoms[name]

    def client_ids(self) -> list[int]:
        """Managed windows in the order the WM started managing them (newest last), but
        panels (EWMH type ``DOCK``: the ``vm`` session's top bar and dock, :mod:`.vm_look`),
        which on the VM are drawn by GNOME Shell and are no windows at all."""
        prop = self.root.get_full_property(self.atom("_NET_CLIENT_LIST"), Xatom.WINDOW)
        ids = list(prop.value) if prop is not None else []
        self._docks = {wid: self._docks.get(wid, None) for wid in ids}  # forget closed ones
        for wid in ids:
            if self._docks[wid] is None:
                self._docks[wid] = self._is_dock(wid)
        return [wid for wid in ids if not self._docks[wid]]

    def _is_dock(self, wid: int) -> bool:
        win = self.d.create_resource_object("window", wid)
        try:
            prop = win.get_full_property(self.atom("_NET_WM_WINDOW_TYPE"), Xatom.ATOM)
        except Exception:  # BadWindow: it closed meanwhile
            return False
        return prop is not None and self.atom("_NET_WM_WINDOW_TYPE_DOCK") in prop.value

    def info(self, wid: int) -> WindowInfo | None:
        """Title, class and root-relative geometry, or ``None`` when the window is gone."""
        win = self.d.create_resource_object("window", wid)
        try:
            title = self._title(win)
            wm_class = win.get_wm_class() or ("", "")
            geo = win.get_geometry()
            pos = win.translate_coords(self.root, 0, 0)
        except Exception:  # BadWindow: it closed meanwhile
            return None
        return WindowInfo(
            wid, title, (wm_class[0], wm_class[1]), -pos.x, -pos.y, geo.width, geo.height
        )

    def clients(self) -> list[WindowInfo]:
        return [w for w in (self.info(wid) for wid in self.client_ids()) if w is not None]

    def find(self, name: str, *, strict: bool = False, by_class: bool = False) -> list[WindowInfo]:
        """Windows matching ``name`` as wmctrl does: a case-insensitive substring of the title;
        ``strict``: the whole string, case-sensitive; ``by_class``: match ``instance.class``.
        The VM's app names in ``name`` match the local apps' too (``Google Chrome`` finds
        Chromium's windows: :func:`.vm_windows.title_variants`)."""
        names = vm_windows.title_variants(name)
        found = []
        for win in self.clients():
            text = f"{win.wm_class[0]}.{win.wm_class[1]}" if by_class else win.title
            if any((text == n) if strict else (n.lower() in text.lower()) for n in names):
                found.append(win)
        return found

    def focused_client(self) -> int | None:
        """The managed window holding the keyboard focus (or an ancestor of it), or ``None``."""
        focus = self.d.get_input_focus().focus
        if isinstance(focus, int):  # X.NONE or X.PointerRoot
            return None
        clients = set(self.client_ids())
        win = focus
        for _ in range(32):
            if win.id in clients:
                return win.id
            if win.id == self.root.id:
                return None
            try:
                parent = win.query_tree().parent
            except Exception:
                return None
            if not parent or parent.id in (0, win.id):
                return None
            win = parent
        return None

    def activate(self, wid: int, *, wait: bool = True) -> bool:
        """Ask the WM to raise and focus ``wid`` (``_NET_ACTIVE_WINDOW``); optionally wait up to
        0.25 s until it has the focus. Returns whether it has it."""
        self._send(wid, "_NET_ACTIVE_WINDOW", [2, X.CurrentTime, 0, 0, 0])
        if not wait:
            return True
        deadline = time.monotonic() + FOCUS_TIMEOUT_S
        while self.focused_client() != wid:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def close(self, wid: int) -> None:
        """Ask the WM to close ``wid`` gracefully (``_NET_CLOSE_WINDOW``, as wmctrl ``-c``)."""
        self._send(wid, "_NET_CLOSE_WINDOW", [X.CurrentTime, 2, 0, 0, 0])

    def kill(self, wid: int) -> None:
        """Close the X connection of the client owning ``wid`` (``XKillClient``, as ``xkill``):
        for a window that ignores :meth:`close`. Its process usually exits with it."""
        self.d.kill_client(wid)
        self.d.sync()

    def ensure_focus(self) -> int | None:
        """If no managed window has the focus (e.g. after a click on the empty desktop, which
        unfocuses everything in openbox: docs/local-desktop.md §5), focus the newest one.
        Returns the focused window id, or ``None`` when there is no window."""
        current = self.focused_client()
        if current is not None:
            return current
        ids = self.client_ids()
        if not ids:
            return None
        self.activate(ids[-1])
        return ids[-1]

    def accessibility_xml(self) -> str:
        """A minimal accessibility tree: one ``<frame>`` per window, what ``/accessibility``
        answers where AT-SPI is not there (:mod:`.accessibility`)."""
        focused = self.focused_client()
        rows = [
            f"<frame name={quoteattr(w.title)} class={quoteattr(w.wm_class[1])} "
            f'x="{w.x}" y="{w.y}" width="{w.width}" height="{w.height}"'
            f"{' focused=' + quoteattr('true') if w.id == focused else ''}/>"
            for w in self.clients()
        ]
        return "<desktop-frame>" + "".join(rows) + "</desktop-frame>"

    def _title(self, win: Window) -> str:
        prop = win.get_full_property(self.atom("_NET_WM_NAME"), self.atom("UTF8_STRING"))
        if prop is not None and prop.value:
            value = prop.value
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        name = win.get_wm_name()
        if isinstance(name, bytes):
            return name.decode("latin-1")
        return name or ""

    def _send(self, wid: int, message: str, data: list[int]) -> None:
        win = self.d.create_resource_object("window", wid)
        ev = event.ClientMessage(window=win, client_type=self.atom(message), data=(32, data))
        self.root.send_event(ev, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)
        self.d.sync()
