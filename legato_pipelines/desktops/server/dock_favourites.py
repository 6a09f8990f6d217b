"""The ``vm`` session's dock shows the desktop user's ``org.gnome.shell favorite-apps``, live, as
GNOME Shell's dock does on OSWorld's VM (its ``AppFavorites`` reloads on the key's ``changed``
signal): a task's setup, the policy's ``gsettings`` in a terminal or a reset change what it shows.

Trigger: the key lives in the desktop user's dconf database, ``~/.config/dconf/user`` (the
session bus's ``dconf-service`` writes it, always to a new file renamed into place:
:mod:`.dbus_session`). The server looks at that file's ``stat`` (inode, size, times:
:meth:`DockFavourites.changed`, a couple of microseconds) at the start and end of every ready
wait; only when it changed does it read the key (``gsettings get`` run as the desktop user,
inside the sandbox: the file is the task's, never parsed by the server) and, when the dock's
favourites differ from what it shows, rewrite the dock's configuration and replace its
``tint2``: a new one is started over the old one (:func:`wait_for_dock`), then the old one
is ended. Not ``SIGUSR1``: on it tint2 reloads, but by tearing its panels down and building
them again in the same process (src/main.c), so the dock's strut is gone meanwhile and
openbox resizes every maximized window to the full width and back (measured on a maximized
xterm: 1208 -> 1280 -> 1208 px); with two docks for a moment the work area never changes. A
reset makes HOME the baseline's, whose favourites are :data:`.vm_look.FAVOURITES`: the reset
restores that dock without reading.

The dock's FIFO (:mod:`.dock_channel`) accepts the names shown: :attr:`DockFavourites.commands`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import vm_look

#: At most this long (s) a reload waits for the dock's new window and its icons.
RELOAD_TIMEOUT_S = 5.0
RELOAD_POLL_S = 0.01


class DockFavourites:
    """The dock's favourites: what it shows and the file that says what it should.

    Args:
      folders    where desktop files are looked up (:func:`.vm_look.favourites`)
      panels     the panels' configuration folder (:func:`.vm_look.panel_configs`)
      launch     a favourite's ``Exec`` in the dock (:meth:`.DockChannel.exec_line`)
      dconf_db   the desktop user's dconf database on the host (``~/.config/dconf/user``)
    """

    def __init__(
        self,
        folders: Sequence[Path],
        panels: Path,
        launch: Callable[[str], str],
        dconf_db: Path,
    ):
        self.folders = list(folders)
        self.panels = Path(panels)
        self.launch = launch
        self.dconf_db = Path(dconf_db)
        #: the desktop file ids the dock shows, in order
        self.shown: tuple[str, ...] = ()
        #: the argv each shown favourite opens (what the dock's FIFO accepts)
        self.commands: dict[str, list[str]] = {}
        self._seen: tuple[int, ...] | None = None

    def write(self, names: Sequence[str]) -> list[Path]:
        """Write the panels' configurations for the favourites ``names`` (those the dock can
        show: :func:`.vm_look.favourites`) and make them the shown ones; returns the
        configuration files (top bar, dock)."""
        found = vm_look.favourites(self.folders, names)
        configs = vm_look.panel_configs(self.panels, found, self.launch)
        self.shown = tuple(fav.name for fav in found)
        self.commands = {fav.name: list(fav.argv) for fav in found}
        return configs

    def shows(self, names: Sequence[str]) -> bool:
        """Whether the dock shows what it would for ``names`` already."""
        return tuple(f.name for f in vm_look.favourites(self.folders, names)) == self.shown

    def signature(self) -> tuple[int, ...] | None:
        """The dconf database's inode, size, modification and change times (ns), not
        followed if a link; ``None`` when there is none."""
        try:
            st = os.stat(self.dconf_db, follow_symlinks=False)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def changed(self) -> bool:
        """Whether the database changed since :meth:`mark_seen` (one ``stat``)."""
        return self.signature() != self._seen

    def mark_seen(self) -> None:
        """The database as it is now is the one the dock follows."""
        self._seen = self.signature()


def dock_windows(display, pid: int) -> set[int]:
    """Ids of the managed windows (``_NET_CLIENT_LIST``) of process ``pid``
    (``_NET_WM_PID``), on ``display`` (an open python-xlib ``Display``)."""
    from Xlib import X
    from Xlib.error import XError

    root = display.screen().root
    clients = root.get_full_property(display.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
    wm_pid = display.intern_atom("_NET_WM_PID")
    found = set()
    for wid in clients.value if clients is not None else ():
        try:
            prop = display.create_resource_object("window", wid).get_full_property(
                wm_pid, X.AnyPropertyType
            )
        except XError:  # gone meanwhile
            continue
        if prop is not None and len(prop.value) and int(prop.value[0]) == pid:
            found.add(int(wid))
    return found


def wait_for_dock(
    display_name: str, panel: subprocess.Popen, icons: int, timeout: float = RELOAD_TIMEOUT_S
) -> float:
    """Wait until the dock ``tint2`` process ``panel`` (just started) shows: a window of its
    own is managed and viewable, openbox's work area leaves room for the dock, and the dock's
    column on the screen stays the same over two looks :data:`RELOAD_POLL_S` apart and is
    drawn (tint2 maps its window black, then draws: not one plain colour with ``icons`` > 0,
    not black without). Returns the seconds it took. Raises ``RuntimeError`` when tint2
    exited, or it did not show the dock within ``timeout`` seconds (says what it waited for)."""
    from Xlib import X
    from Xlib import display as xdisplay
    from Xlib.error import XError

    t0 = time.monotonic()
    d = xdisplay.Display(display_name)
    try:
        root = d.screen().root
        height = d.screen().height_in_pixels
        workarea = d.intern_atom("_NET_WORKAREA")
        deadline = t0 + timeout
        last = None
        waiting = "its window"
        while True:
            if panel.poll() is not None:
                raise RuntimeError(f"tint2 exited with {panel.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the dock was not shown within {timeout:.0f} s ({waiting})")
            time.sleep(RELOAD_POLL_S)
            try:
                viewable = [
                    wid
                    for wid in dock_windows(d, panel.pid)
                    if d.create_resource_object("window", wid).get_attributes().map_state
                    == X.IsViewable
                ]
            except XError:
                continue
            if not viewable:
                continue
            area = root.get_full_property(workarea, X.AnyPropertyType)
            if area is None or len(area.value) < 2 or area.value[0] < vm_look.DOCK_PX:
                waiting = "the work area"
                continue
            waiting = "its icons drawn"
            top = vm_look.TOP_BAR_PX
            pixels = root.get_image(0, top, vm_look.DOCK_PX, height - top, X.ZPixmap, 0xFFFFFFFF)
            column = bytes(pixels.data)
            plain = column == column[:4] * (len(column) // 4)
            drawn = not plain if icons else column[:3] != b"\x00\x00\x00"
            if column == last and drawn:
                return time.monotonic() - t0
            last = column
    finally:
        d.close()
