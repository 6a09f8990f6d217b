"""State one attempt leaves that the next must not see, set as a policy could (commands inside
the sandbox, as the user or as root through ``sudo``), through the desktop's own routes: the
XKB keymap, the sandbox's network namespace, the window manager's desktops and root-window
properties, and the desktop server's own X connections. Real servers on real Xvfb and real
sandboxes (docs/sandbox.md §3-§4); each attack outlived a fast reset before the fix."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import time

import pytest

from legato_pipelines.actions import Action
from tests.desktop_local_support import RunningServer, needs_apps, needs_xvfb

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
]


@pytest.fixture(scope="module")
def server():
    running = RunningServer(640, 480)
    yield running
    running.stop()


def sudo(command: str) -> str:
    """``command`` run by root inside the sandbox (``sudo -S sh -c``), stderr kept."""
    return f"echo password | sudo -S sh -c {shlex.quote(command)} 2>&1"


async def sh(client, command: str) -> dict:
    return await client.execute(command, shell=True, timeout=60)


#: Rewrites the action of key <AC01> ('a') into a redirect to <AB01> ('z') with xkbcomp.
REDIRECT_A = (
    "xkbcomp $DISPLAY /tmp/km.xkb 2>/dev/null; "
    'sed -i "/key <AC01> {/,/};/c\\    key <AC01> {\\n type= \\"ALPHABETIC\\",\\n '
    "symbols[Group1]= [ a, A ],\\n actions[Group1]= [ RedirectKey(key=<AB01>), "
    'RedirectKey(key=<AB01>) ]\\n };" /tmp/km.xkb && xkbcomp /tmp/km.xkb $DISPLAY 2>/dev/null'
)
AC01_ACTIONS = "xkbcomp $DISPLAY - 2>/dev/null | grep -A4 'key <AC01>' | grep -c RedirectKey"


async def typed_into_xterm(client, text: str) -> str:
    """What an xterm of this attempt receives when the policy types ``text`` and Return."""
    await sh(client, "rm -f /tmp/typed")
    await client.launch(["xterm", "-e", "sh", "-c", 'read l; echo "$l" > /tmp/typed'])
    await client.wait("launch")
    await client.act(Action("type", text=text))
    await client.act(Action("key", keys=("Return",)))
    for _ in range(50):
        out = await sh(client, "cat /tmp/typed 2>/dev/null")
        if out["output"].strip():
            return out["output"].strip()
        time.sleep(0.1)
    return ""


@needs_apps
async def test_xkb_key_actions_set_by_an_attempt_are_gone_after_a_fast_reset(server):
    client = server.client()
    try:
        await client.reset(full=False)
        assert (await sh(client, REDIRECT_A))["returncode"] == 0
        assert (await sh(client, AC01_ACTIONS))["output"].strip() != "0"  # planted
        reset = await client.reset(full=False)
        assert reset["kind"] == "fast", reset
        assert "xkb_keymap" in reset.get("x_restored", []), reset
        assert (await sh(client, AC01_ACTIONS))["output"].strip() == "0", reset
        assert await typed_into_xterm(client, "banana") == "banana"
    finally:
        await client.reset(full=False)
        await client.aclose()


@needs_apps
async def test_the_desktops_own_unicode_typing_does_not_make_the_reset_reload_the_keymap(server):
    """Typing ``é`` maps a spare keycode (core mapping, :mod:`.input`): an XKB map change
    the reset must not take for a task's, so no keymap reload is paid."""
    client = server.client()
    try:
        await client.reset(full=False)
        assert await typed_into_xterm(client, "café") == "café"
        reset = await client.reset(full=False)
        assert reset["kind"] == "fast", reset
        assert "xkb_keymap" not in reset.get("x_restored", []), reset
    finally:
        await client.aclose()


LOOPBACK = (
    "ip -br link show lo; ip route show table all type blackhole | wc -l; python3 -c "
    "\"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
    "socket.create_connection(s.getsockname(),2); print('loopback ok')\" 2>&1 | tail -1"
)


async def test_root_inside_cannot_take_the_loopback_down_or_add_routes(server):
    client = server.client()
    try:
        await client.reset(full=False)
        attack = sudo("ip route add blackhole 198.51.100.0/24; ip link set lo down; echo done")
        out = await sh(client, attack)
        assert "done" in out["output"], out
        await client.reset(full=False)
        after = (await sh(client, LOOPBACK))["output"].split("\n")
        assert "UP" in after[0] or "UNKNOWN" in after[0], after
        assert after[1:3] == ["0", "loopback ok"], after
    finally:
        await client.aclose()


@pytest.mark.skipif(shutil.which("pasta") is None, reason="network own needs pasta (passt)")
async def test_network_own_still_reaches_its_forwarded_port_with_net_admin_dropped():
    """pasta configures the namespace from the host: a listener inside on the VLC port (8080)
    answers on its forwarded host port, and the loopback is up."""
    running = RunningServer(320, 240, extra_args=("--network", "own"))
    client = running.client()
    try:
        await client.reset(full=False)
        port = running.info["ports"]["vlc"]
        serve = "nohup python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 &"
        await client.launch(["sh", "-c", serve])
        body = b""
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                    conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    body = conn.recv(64)
                if body:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert body.startswith(b"HTTP/1.0 200"), body
        assert "loopback ok" in (await sh(client, LOOPBACK))["output"]
    finally:
        await client.aclose()
        running.stop()


#: Prints, as JSON, the window manager's desktops and the root window's property names.
ROOT_PROBE = (
    "python3 -c '"
    "import json\nfrom Xlib import X\nfrom Xlib.display import Display\n"
    "d = Display(); r = d.screen().root\n"
    "def card(n):\n p = r.get_full_property(d.intern_atom(n), X.AnyPropertyType)\n"
    " return None if p is None else list(p.value)\n"
    'names = r.get_full_property(d.intern_atom("_NET_DESKTOP_NAMES"), X.AnyPropertyType)\n'
    'print(json.dumps({"number": card("_NET_NUMBER_OF_DESKTOPS"),'
    ' "current": card("_NET_CURRENT_DESKTOP"),'
    ' "names": None if names is None else bytes(names.value).decode(),'
    ' "props": sorted(d.get_atom_name(a) for a in r.list_properties())}))\' 2>&1'
)


async def root_probe(client) -> dict:
    out = await sh(client, ROOT_PROBE)
    return json.loads(out["output"].strip().splitlines()[-1])


async def test_wm_desktops_and_root_properties_set_by_an_attempt_are_back_after_a_fast_reset(
    server,
):
    client = server.client()
    try:
        await client.reset(full=False)
        before = await root_probe(client)
        attack = (
            "wmctrl -n 3 && sleep 0.3 && wmctrl -s 2 && xprop -root -f _LEGATO_PLANT 8s -set _LEGATO_PLANT x && "
            "xprop -root -f _NET_DESKTOP_NAMES 8u -set _NET_DESKTOP_NAMES planted && sleep 0.3"
        )
        out = await sh(client, attack)
        assert out["returncode"] == 0, out
        during = await root_probe(client)
        assert during["number"] == [3] and during["current"] == [2], during
        assert "_LEGATO_PLANT" in during["props"], during
        reset = await client.reset(full=False)
        assert reset["kind"] == "fast", reset
        assert "root_properties" in reset["x_restored"], reset
        assert await root_probe(client) == before, reset
    finally:
        await client.aclose()


#: Kills (XKillClient) every X client but the X server's, the window manager's and its own:
#: the desktop server's connections (X-Resource lists every client).
KILL_SERVERS = (
    "python3 -c '"
    "from Xlib import X\nfrom Xlib.display import Display\nfrom Xlib.protocol import request\n"
    "d = Display(); r = d.screen().root; mask = d.display.info.resource_id_mask\n"
    'wm = r.get_full_property(d.intern_atom("_NET_SUPPORTING_WM_CHECK"), X.AnyPropertyType)'
    ".value[0]\n"
    "keep = (0, d.display.info.resource_id_base, wm & ~mask)\n"
    "n = 0\n"
    "for c in d.res_query_clients().clients:\n"
    " if c.resource_base not in keep:\n"
    "  request.KillClient(display=d.display, resource=c.resource_base)\n"
    "  n += 1\n"
    # a round trip: the kills are done when it answers (python-xlib may fail to decode an
    # error reply to one of them, which changes nothing on the server)
    "d.flush()\ntry:\n d.get_atom_name(1)\nexcept Exception:\n pass\n"
    'print("killed", n)\' 2>&1'
)


async def test_the_servers_x_connections_killed_from_inside_cost_one_reset_not_the_desktop(
    server,
):
    client = server.client()
    try:
        await client.reset(full=False)
        out = await sh(client, KILL_SERVERS)
        assert out["output"].startswith("killed") and out["output"].split()[1] != "0", out
        reset = await client.reset(full=False)
        assert reset["kind"] == "full", reset  # the connections were found dead
        assert (await client.screenshot())[:4] == b"\x89PNG"
        await client.act(Action("left_click", x=10, y=10))
        assert (await client.reset(full=False))["kind"] == "fast"
    finally:
        await client.aclose()
