"""Drop text on the panel window under a screen point through XDND, as any X client of the
display can (run inside a desktop by tests/test_vm_session.py, with the desktop's python3 and
python-xlib): ``python3 xdnd_drop.py X Y TEXT``. Prints ``finished <accepted>`` when the
target answers XdndFinished (1: it took the drop), ``refused`` or ``timeout``."""

import sys
import time

from Xlib import X, Xatom, display
from Xlib.protocol import event

x, y, text = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode() + b"\n"
d = display.Display()
root = d.screen().root


def atom(name):
    return d.intern_atom(name)


def panel_at(px, py, parent=None):
    """The window of class tint2 whose rectangle (in root coordinates) holds the point, at
    any depth (the window manager reparents the panels into its frames)."""
    for child in (parent or root).query_tree().children:
        try:
            cls, geo = child.get_wm_class(), child.get_geometry()
            origin = root.translate_coords(child, 0, 0)
        except Exception:
            continue
        inside = origin.x <= px < origin.x + geo.width and origin.y <= py < origin.y + geo.height
        if cls and "tint2" in cls[0].lower() and inside:
            return child
        found = panel_at(px, py, child)
        if found is not None:
            return found
    return None


target = panel_at(x, y)
if target is None:
    print("no panel there")
    sys.exit(2)
source = root.create_window(0, 0, 1, 1, 0, X.CopyFromParent)
source.set_selection_owner(atom("XdndSelection"), X.CurrentTime)
d.sync()


def send(kind, data):
    target.send_event(event.ClientMessage(window=target, client_type=atom(kind), data=(32, data)))
    d.flush()


send("XdndEnter", [source.id, 5 << 24, Xatom.STRING, 0, 0])
send("XdndPosition", [source.id, 0, (x << 16) | y, X.CurrentTime, atom("XdndActionCopy")])
dropped, deadline = False, time.monotonic() + 10
while time.monotonic() < deadline:
    while d.pending_events():
        e = d.next_event()
        if e.type == X.ClientMessage and e.client_type == atom("XdndStatus") and not dropped:
            if not e.data[1][1] & 1:
                print("refused")
                sys.exit(1)
            send("XdndDrop", [source.id, 0, X.CurrentTime, 0, 0])
            dropped = True
        elif e.type == X.ClientMessage and e.client_type == atom("XdndFinished"):
            print("finished", e.data[1][1])
            sys.exit(0)
        elif e.type == X.SelectionRequest:
            e.requestor.change_property(e.property, Xatom.STRING, 8, text)
            notify = event.SelectionNotify(
                time=e.time,
                requestor=e.requestor,
                selection=e.selection,
                target=e.target,
                property=e.property,
            )
            e.requestor.send_event(notify)
            d.flush()
    time.sleep(0.02)
print("timeout")
sys.exit(1)
