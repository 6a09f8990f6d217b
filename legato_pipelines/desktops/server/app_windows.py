"""Which process owns a window, and which windows are an app's main windows.

The popup guard (``desktops/popups.py``) must not take the windows of the apps the task's
setup launched for popups (GIMP's main window maps seconds after its splash), and the reset's
ready wait waits for a launched app's main window. Both need a window's process: the X server
knows it (the X-Resource extension's ``QueryClientIds`` with ``LocalClientPIDMask``, from the
client socket's peer credentials), as a *host* pid, where ``_NET_WM_PID`` holds the pid the app
sees, which inside the sandbox's pid namespace is not the host's (docs/sandbox.md), and which
not every toolkit sets. A main window is a managed window of EWMH type ``NORMAL`` (or of no
type, which EWMH says to treat as ``NORMAL``): not a splash screen, dialog or utility.
Use on the server's X thread (:mod:`.xthread`).
"""

from __future__ import annotations

from Xlib import Xatom
from Xlib.display import Display
from Xlib.ext import res


def owners_known(display: Display) -> bool:
    """Whether the X server can tell a window's process (it has the X-Resource extension)."""
    return display.has_extension(res.extname)


def window_pids(display: Display, ids: list[int]) -> dict[int, int]:
    """``{window id: host pid of the X client that created it}`` for the windows in ``ids``
    whose client the X server can identify (a local client; Xvfb has X-Resource 1.2). One
    round trip per window. Windows that are gone or unidentified are left out; an X server
    without the extension answers ``{}``."""
    if not ids or not owners_known(display):
        return {}
    pids: dict[int, int] = {}
    for wid in ids:
        try:
            reply = display.res_query_client_ids([{"client": wid, "mask": res.LocalClientPIDMask}])
        except Exception:  # BadValue: the window closed meanwhile
            continue
        for entry in reply.ids:
            if entry.spec.mask & res.LocalClientPIDMask and entry.value:
                pids[wid] = int(entry.value[0])
    return pids


def is_main_window(display: Display, wid: int) -> bool:
    """Whether ``wid`` is a main window by EWMH ``_NET_WM_WINDOW_TYPE``: ``NORMAL`` or no type
    (not a splash, dialog, utility, ...). False when the window is gone."""
    win = display.create_resource_object("window", wid)
    try:
        prop = win.get_full_property(display.intern_atom("_NET_WM_WINDOW_TYPE"), Xatom.ATOM)
    except Exception:  # BadWindow: closed meanwhile
        return False
    if prop is None or not len(prop.value):
        return True
    return int(prop.value[0]) == display.intern_atom("_NET_WM_WINDOW_TYPE_NORMAL")
