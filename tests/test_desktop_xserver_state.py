"""The X server of a sandboxed desktop, attacked as a policy could (commands inside the sandbox,
as the user or as root through ``sudo``): what one attempt sets in the X server is back to the
desktop's start after the next fast reset, and MIT-SHM reaches no System V segment of the host
while the sandbox's own apps can still use it. Real servers on real Xvfb (docs/sandbox.md)."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shlex
import tempfile
import time
from pathlib import Path

import pytest

from legato_pipelines.actions import Action
from tests.desktop_local_support import RunningServer, needs_apps, needs_xvfb

pytestmark = [needs_xvfb, pytest.mark.desktop]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)")


@pytest.fixture(scope="module")
def server():
    running = RunningServer(640, 480)
    yield running
    running.stop()


def py(script: str, root: bool = False, args: str = "") -> str:
    """A shell command running the Python ``script`` (with ``args``) inside the sandbox with
    the system's python3 and python-xlib (as ``user``, or as root through ``sudo``)."""
    command = f"python3 -c {shlex.quote(script)} {args}"
    if root:
        return f"echo password | sudo -S sh -c {shlex.quote(command)} 2>&1"
    return f"{command} 2>&1"


#: Prints, as JSON, the parts of the X server's state the attacks below change.
PROBE = r"""
import json
from Xlib import X
from Xlib.display import Display
d = Display()
root = d.screen().root
def prop(name):
    p = root.get_full_property(d.intern_atom(name), X.AnyPropertyType)
    return None if p is None else bytes(p.value).decode("latin-1")
owner = d.get_selection_owner(d.intern_atom("CLIPBOARD"))
print(json.dumps({
    "locks": root.query_pointer().mask & (X.LockMask | X.Mod2Mask),
    "buttons": d.get_pointer_mapping()[:3],
    "saver": d.get_screen_saver().timeout,
    "resources": prop("RESOURCE_MANAGER"),
    "cut_buffer": prop("CUT_BUFFER0"),
    "clipboard": int(getattr(owner, "id", owner) or 0),
    "font_path": d.get_font_path(),
    "access": d.list_hosts().mode,
    "top_windows": len(root.query_tree().children),
}))
"""

#: Each kind of state, set as a policy could: a shell command run inside the sandbox.
ATTACKS = {
    "caps_lock": "xdotool key Caps_Lock",
    "buttons": py(
        "from Xlib.display import Display\n"
        "d = Display(); m = d.get_pointer_mapping(); m[0], m[2] = m[2], m[0]\n"
        "d.set_pointer_mapping(m); d.sync()"
    ),
    "saver": py(
        "from Xlib.display import Display\nd = Display(); d.set_screen_saver(3, 3, 1, 1); d.sync()"
    ),
    "resources": py(
        "from Xlib import Xatom\nfrom Xlib.display import Display\n"
        "d = Display(); a = d.intern_atom('RESOURCE_MANAGER')\n"
        "d.screen().root.change_property(a, Xatom.STRING, 8, b'XTerm*planted: yes\\n'); d.sync()"
    ),
    # a client that keeps its resources after it exits, owning the clipboard with its window
    "cut_buffer_and_selection": py(
        "from Xlib import X, Xatom\nfrom Xlib.display import Display\n"
        "d = Display(); r = d.screen().root\n"
        "r.change_property(d.intern_atom('CUT_BUFFER0'), Xatom.STRING, 8, b'from attempt 1')\n"
        "w = r.create_window(0, 0, 1, 1, 0, 0)\n"
        "d.set_close_down_mode(X.RetainPermanent)\n"
        "w.set_selection_owner(d.intern_atom('CLIPBOARD'), X.CurrentTime); d.sync()"
    ),
    # a client that keeps a window over the screen after its process ended
    "retained_window": py(
        "from Xlib import X\nfrom Xlib.display import Display\n"
        "d = Display(); s = d.screen()\n"
        "w = s.root.create_window(0, 0, 200, 200, 0, s.root_depth, override_redirect=True)\n"
        "w.map(); d.set_close_down_mode(X.RetainPermanent); d.sync()"
    ),
    "font_path": py(
        "import sys\nfrom Xlib.display import Display\n"
        "d = Display(); d.set_font_path([sys.argv[1], *d.get_font_path()]); d.sync()",
        args="{font_dir}",
    ),
    "access": py(
        "from Xlib import X\nfrom Xlib.display import Display\n"
        "d = Display(); d.set_access_control(X.DisableAccess); d.sync()",
        root=True,
    ),
}


@pytest.fixture(scope="module")
def host_font_dir():
    """A host directory the X server accepts as a font path element (a ``fonts.dir``)."""
    path = Path(tempfile.mkdtemp(prefix="legato-host-fonts-"))
    (path / "fonts.dir").write_text("0\n")
    path.chmod(0o755)
    yield str(path)
    (path / "fonts.dir").unlink()
    path.rmdir()


async def probe(client) -> dict:
    out = await client.execute(py(PROBE), shell=True)
    assert out["returncode"] == 0, out
    return json.loads(out["output"].strip().splitlines()[-1])


@needs_root
@pytest.mark.parametrize("kind", sorted(ATTACKS))
async def test_x_server_state_a_task_set_is_back_after_a_fast_reset(server, kind, host_font_dir):
    client = server.client()
    try:
        await client.reset(full=False)
        before = await probe(client)
        command = ATTACKS[kind].replace("{font_dir}", host_font_dir)
        out = await client.execute(command, shell=True)
        assert out["returncode"] == 0, out
        during = await probe(client)
        assert during != before, f"the attack {kind} changed nothing: {during}"
        reset = await client.reset(full=False)
        assert reset["kind"] == "fast", reset  # set back in place, no X restart
        assert await probe(client) == before, reset
    finally:
        await client.aclose()


@needs_root
@needs_apps
async def test_a_planted_xterm_translation_runs_nothing_in_the_next_attempt(server):
    """``RESOURCE_MANAGER`` planted in one attempt (as ``xrdb -merge`` would): an xterm of the
    next attempt must not run the planted command when the policy presses Return."""
    client = server.client()
    marker = f"/tmp/planted-{secrets.token_hex(4)}"
    plant = (
        "from Xlib import X, Xatom\nfrom Xlib.display import Display\n"
        "d = Display(); r = d.screen().root; a = d.intern_atom('RESOURCE_MANAGER')\n"
        "old = bytes(r.get_full_property(a, X.AnyPropertyType).value)\n"
        "new = b'XTerm*VT100.translations: #override <Key>Return: "
        f'string(\\" ; touch {marker}\\") string(0x0d)\\n\'\n'
        "r.change_property(a, Xatom.STRING, 8, old + new); d.sync()"
    )
    try:
        await client.reset(full=False)
        assert (await client.execute(py(plant), shell=True))["returncode"] == 0
        assert (await client.reset(full=False))["kind"] == "fast"
        await client.launch(["xterm"])
        await client.wait("launch")
        await client.act(Action("type", text="true"))
        await client.act(Action("key", keys=("Return",)))
        await client.wait("action")
        time.sleep(0.5)
        out = await client.execute(f"ls {marker}", shell=True)
        assert out["returncode"] != 0, "the planted translation ran in the next attempt"
    finally:
        await client.reset(full=False)
        await client.aclose()


# -- MIT-SHM ------------------------------------------------------------------------------------

#: Asks the X server to attach System V segment argv[1] (read-only) and copy its first 64
#: bytes into a pixmap, then reads the pixmap back: what the X server could read of it.
SHM_READ = r"""
import sys
from Xlib import X
from Xlib.display import Display
from Xlib.protocol import rq
class Attach(rq.Request):
    _request = rq.Struct(rq.Card8("opcode"), rq.Opcode(1), rq.RequestLength(),
        rq.Card32("shmseg"), rq.Card32("shmid"), rq.Bool("read_only"), rq.Pad(3))
class PutImage(rq.Request):
    _request = rq.Struct(rq.Card8("opcode"), rq.Opcode(3), rq.RequestLength(),
        rq.Drawable("drawable"), rq.GC("gc"), rq.Card16("total_width"),
        rq.Card16("total_height"), rq.Card16("src_x"), rq.Card16("src_y"),
        rq.Card16("src_width"), rq.Card16("src_height"), rq.Int16("dst_x"),
        rq.Int16("dst_y"), rq.Card8("depth"), rq.Card8("format"), rq.Bool("send_event"),
        rq.Pad(1), rq.Card32("shmseg"), rq.Card32("offset"))
d = Display()
op = d.query_extension("MIT-SHM").major_opcode
errors = []
seg = d.display.allocate_resource_id()
Attach(display=d.display, onerror=errors.append, opcode=op, shmseg=seg,
       shmid=int(sys.argv[1]), read_only=True)
d.sync()
if errors:
    print("refused", type(errors[0]).__name__)
    sys.exit(0)
pix = d.screen().root.create_pixmap(16, 1, 24)
gc = pix.create_gc()
PutImage(display=d.display, onerror=errors.append, opcode=op, drawable=pix, gc=gc,
         total_width=16, total_height=1, src_x=0, src_y=0, src_width=16, src_height=1,
         dst_x=0, dst_y=0, depth=24, format=X.ZPixmap, send_event=False, shmseg=seg, offset=0)
d.sync()
print("read", bytes(pix.get_image(0, 0, 16, 1, X.ZPixmap, 0xFFFFFFFF).data).hex())
"""

IPC_PRIVATE, IPC_CREAT, IPC_RMID = 0, 0o1000, 0


class HostSegment:
    """A System V shared memory segment of the host (this test process's ipc namespace),
    0600 and root's, holding ``pattern``."""

    def __init__(self, pattern: bytes):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.shmat.restype = ctypes.c_void_p
        self.shmid = self.libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o600)
        assert self.shmid >= 0, os.strerror(ctypes.get_errno())
        self.addr = self.libc.shmat(self.shmid, None, 0)
        ctypes.memmove(self.addr, pattern, len(pattern))

    def close(self) -> None:
        self.libc.shmdt(ctypes.c_void_p(self.addr))
        self.libc.shmctl(self.shmid, IPC_RMID, None)


@needs_root
async def test_root_inside_cannot_make_the_x_server_read_a_host_shm_segment(server):
    pattern = bytes(range(1, 65))
    segment = HostSegment(pattern)
    client = server.client()
    try:
        out = await client.execute(py(SHM_READ, root=True, args=str(segment.shmid)), shell=True)
        lines = out["output"].strip().splitlines()
        assert lines, out
        last = lines[-1]
        if last.startswith("read "):
            data = bytes.fromhex(last.split()[1])
            same = [i for i in range(64) if i % 4 != 3 and data[i] == pattern[i]]
            assert len(same) < 40, f"the X server read the host's segment: {data.hex()}"
        else:
            assert last.startswith("refused"), out
    finally:
        segment.close()
        await client.reset(full=False)
        await client.aclose()


#: An app's own use of MIT-SHM: a segment of its own holding a pattern, attached and read
#: by the X server; prints ``same`` when the X server read back the app's own bytes.
SHM_OWN = r"""
import ctypes, subprocess, sys
libc = ctypes.CDLL(None)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, 4096, 0o1000 | 0o600)
ctypes.memmove(libc.shmat(shmid, None, 0), bytes(range(101, 165)), 64)
out = subprocess.run([sys.executable, "-c", sys.argv[1], str(shmid)], capture_output=True, text=True).stdout
last = out.strip().splitlines()[-1]
data = bytes.fromhex(last.split()[1]) if last.startswith("read ") else b""
same = len(data) == 64 and all(data[i] == 101 + i for i in range(64) if i % 4 != 3)
print("same" if same else "differs: " + last)
"""


@needs_root
async def test_apps_inside_can_still_use_mit_shm(server):
    """An X client inside attaching a segment of its own: the X server sees that very segment
    (it shares the sandbox's ipc namespace), so MIT-SHM works for the desktop's apps. (Before,
    the X server looked the id up among the host's segments.)"""
    client = server.client()
    try:
        out = await client.execute(py(SHM_OWN, args=shlex.quote(SHM_READ)), shell=True)
        assert out["output"].strip().splitlines()[-1] == "same", out
    finally:
        await client.reset(full=False)
        await client.aclose()


#: Opens (``create``: creates) the POSIX message queue ``/legato-attempt``; prints ``ok`` or
#: the error.
MQ_OPEN = r"""
import ctypes, os, sys
rt = ctypes.CDLL("librt.so.1", use_errno=True)
flags = os.O_RDWR | (os.O_CREAT if sys.argv[1] == "create" else 0)
fd = rt.mq_open(b"/legato-attempt", flags, 0o600, None)
print("ok" if fd >= 0 else os.strerror(ctypes.get_errno()))
"""


@needs_root
async def test_posix_queues_and_semaphores_of_an_attempt_are_gone_after_the_reset(server):
    """The sandbox's ipc namespace is the X server's, which outlives the sandbox: a POSIX
    message queue is emptied by the fast reset, a System V semaphore by the revert."""
    client = server.client()
    try:
        await client.reset(full=False)
        out = await client.execute(py(MQ_OPEN, args="create") + "; ipcmk -S 1", shell=True)
        assert out["output"].splitlines()[0] == "ok", out
        reset = await client.reset(full=False)
        assert reset["kind"] == "revert" and "ipc/sem" in reset["reverted"], reset
        out = await client.execute(py(MQ_OPEN, args="open") + "; ipcs -s | grep -c 0x", shell=True)
        assert out["output"].split() == ["No", "such", "file", "or", "directory", "0"], out
    finally:
        await client.aclose()
