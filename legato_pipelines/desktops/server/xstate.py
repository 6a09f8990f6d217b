"""The X server's own state: recorded when the desktop starts, put back by every fast reset.

Killing a task's processes ends its X clients, but not what they set in the X server, which
lives on until Xvfb restarts (a full reset): a locked Caps Lock, a swapped pointer button
map, a screen saver, ``RESOURCE_MANAGER`` (an ``xrdb``-planted xterm translation would run a
command on Return in the next attempt), cut buffers and selections held by a surviving
window, a font path naming host directories, ``xhost +``. The keyboard layout has its own
module (:mod:`.keymap`). Everything here goes through the X protocol, from the desktop's X
thread on a connection of its own (:class:`.xthread.XContext` ``state``; one round trip or so
each, no ``xset``/``xrdb`` process per reset).

:func:`snapshot` reads the baseline; :func:`restore` compares and sets back what differs,
reads it again, and raises :class:`XStateError` when something still differs (or cannot be
set back: the XKB controls, e.g. sticky keys or ``xset r rate``), so the reset falls back
to a full restart, whose new X server starts in the default state.

Two kinds are watched rather than read at every reset (:func:`watch` selects the events on
the state connection when it opens, so a reset reads only what the server reported changed):

- the XKB keymap (key actions and behaviours, key types, the compat map, indicator maps: an
  ``xkbcomp``-loaded ``RedirectKey`` on ``a`` types ``z``): an XKB map/new-keyboard/compat
  event that touches more than the keysyms of spare keycodes (those empty at start, which the
  desktop's own typing maps unicode characters onto, :mod:`.input`) makes the reset load the
  keymap saved at start (``xkbcomp``, run on the host) and compare a fresh dump with it;
- the root window's properties (``PropertyNotify``): one that was not there at start is
  deleted, one that changed is written back, except the window manager's number of desktops
  and current desktop, which are asked of it by client message as ``wmctrl`` does, and the
  properties it keeps up to date itself (:data:`WM_LIVE`).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

from Xlib import X
from Xlib.display import Display
from Xlib.ext import res
from Xlib.protocol import event, request, rq

#: Root-window properties restored to their value at start (deleted when they had none):
#: X resources (``xrdb``, per display and per screen) and the eight cut buffers.
ROOT_PROPERTIES = (
    "RESOURCE_MANAGER",
    "SCREEN_RESOURCES",
    *(f"CUT_BUFFER{i}" for i in range(8)),
)
#: Selections given up (owner ``None``) when a window still holds them after the task's
#: clients ended (an owner set to the root window, or to a retained client's window).
SELECTIONS = ("PRIMARY", "SECONDARY", "CLIPBOARD")
XKB = "XKEYBOARD"
XKB_USE_CORE_KBD = 0x100
#: Root-window properties the window manager (openbox) keeps up to date as windows come and
#: go: neither deleted nor written back by a reset.
WM_LIVE = frozenset({"_NET_ACTIVE_WINDOW", "_NET_CLIENT_LIST", "_NET_CLIENT_LIST_STACKING"})
#: Root-window properties that are the window manager's answer to a request: set back by
#: asking it (EWMH client messages, what ``wmctrl -n``/``-s`` send), in this order.
WM_ASKED = ("_NET_NUMBER_OF_DESKTOPS", "_NET_CURRENT_DESKTOP")
#: Root-window properties the window manager sets as it starts, a little after it announces
#: itself (``_NET_SUPPORTING_WM_CHECK``, what the session waits for): the baseline waits for
#: them (at most :data:`WM_WAIT_S`), or the first reset would delete them as a task's.
WM_STARTUP = (*WM_ASKED, "_NET_DESKTOP_NAMES", "_NET_WORKAREA", "_NET_SHOWING_DESKTOP")
#: How long a reset waits for the window manager to apply :data:`WM_ASKED` (s).
WM_WAIT_S = 2.0
XKBCOMP_TIMEOUT_S = 10.0
#: XKB events watched (XkbSelectEvents): NewKeyboardNotify, MapNotify, IndicatorMapNotify,
#: CompatMapNotify (XKBproto: bits 0, 1, 5, 7), and their numbers.
XKB_EVENTS = 0x01 | 0x02 | 0x20 | 0x80
XKB_MAP_NOTIFY = 1
XKB_KEY_TYPES = 0x01


class XStateError(RuntimeError):
    """The X server's state could not be brought back to the baseline (the message says what)."""


class _UseExtension(rq.ReplyRequest):
    _request = rq.Struct(
        rq.Card8("opcode"),
        rq.Opcode(0),
        rq.RequestLength(),
        rq.Card16("major"),
        rq.Card16("minor"),
    )
    _reply = rq.Struct(
        rq.ReplyCode(),
        rq.Bool("supported"),
        rq.Card16("sequence_number"),
        rq.ReplyLength(),
        rq.Card16("server_major"),
        rq.Card16("server_minor"),
        rq.Pad(20),
    )


class _SelectEvents(rq.Request):
    _request = rq.Struct(
        rq.Card8("opcode"),
        rq.Opcode(1),
        rq.RequestLength(),
        rq.Card16("device"),
        rq.Card16("affect_which"),
        rq.Card16("clear"),
        rq.Card16("select_all"),
        rq.Card16("affect_map"),
        rq.Card16("map"),
    )


class _GetState(rq.ReplyRequest):
    _request = rq.Struct(
        rq.Card8("opcode"),
        rq.Opcode(4),
        rq.RequestLength(),
        rq.Card16("device"),
        rq.Pad(2),
    )
    _reply = rq.Struct(
        rq.ReplyCode(),
        rq.Card8("device"),
        rq.Card16("sequence_number"),
        rq.ReplyLength(),
        rq.FixedBinary("data", 24),
    )


class _LatchLockState(rq.Request):
    _request = rq.Struct(
        rq.Card8("opcode"),
        rq.Opcode(5),
        rq.RequestLength(),
        rq.Card16("device"),
        rq.Card8("affect_mod_locks"),
        rq.Card8("mod_locks"),
        rq.Bool("lock_group"),
        rq.Card8("group_lock"),
        rq.Card8("affect_mod_latches"),
        rq.Card8("mod_latches"),
        rq.Pad(1),
        rq.Bool("latch_group"),
        rq.Int16("group_latch"),
    )


class _GetControls(rq.ReplyRequest):
    _request = rq.Struct(
        rq.Card8("opcode"),
        rq.Opcode(6),
        rq.RequestLength(),
        rq.Card16("device"),
        rq.Pad(2),
    )
    _reply = rq.Struct(
        rq.ReplyCode(),
        rq.Card8("device"),
        rq.Card16("sequence_number"),
        rq.ReplyLength(),
        rq.FixedBinary("data", 84),
    )


@dataclass(frozen=True, slots=True)
class XState:
    """What :func:`snapshot` reads: each field as the X server answers it (tuples, bytes).
    :func:`restore` sets fields back in this order (the XKB locks first: they drive LEDs)."""

    xkb_state: bytes  # latched and locked modifiers, locked group, latched group (b"": no XKB)
    pointer_mapping: tuple[int, ...]
    pointer_control: tuple[int, int, int]  # accel_num, accel_denom, threshold
    keyboard_control: tuple  # auto repeat, click, bell percent/pitch/duration, leds, per key
    screen_saver: tuple[int, int, int, int]  # timeout, interval, prefer blanking, exposures
    font_path: tuple[str, ...]
    access: tuple[int, tuple[tuple[int, bytes], ...]]  # enabled, (family, address)
    properties: tuple[tuple[str, tuple | None], ...]  # ROOT_PROPERTIES: (type, format, value)
    selections: tuple[int, ...]  # owner window ids of SELECTIONS (0: none)
    xkb_controls: bytes  # b"" without XKB
    # -- watched (:func:`watch`), not compared field by field --
    root: tuple[tuple[str, tuple], ...] = ()  # every root property but WM_LIVE: (name, value)
    spare_keycodes: frozenset[int] = frozenset()  # keycodes without keysyms at start
    keymap: bytes = b""  # ``xkbcomp -xkb`` dump at start (b"": no XKB or no xkbcomp)


#: The fields :func:`restore` compares one by one.
COMPARED = tuple(n for n in XState.__slots__ if n not in ("root", "spare_keycodes", "keymap"))


def watch(display: Display) -> None:
    """Ask the X server to report, on ``display`` (the state connection, right after it
    opens), every change of a root-window property and of the XKB keymap (:func:`restore`
    reads the reports)."""
    display.screen().root.change_attributes(event_mask=X.PropertyChangeMask)
    opcode = _xkb_opcode(display)
    if opcode is not None:
        _SelectEvents(
            display=display.display,
            opcode=opcode,
            device=XKB_USE_CORE_KBD,
            affect_which=XKB_EVENTS,
            clear=0,
            select_all=XKB_EVENTS,
            affect_map=0xFF,
            map=0xFF,
        )
    display.sync()


def snapshot(display: Display, keymap: bool = False) -> XState:
    """The state of ``display``'s X server now (a dozen replies: ~1 ms on a quiet local Xvfb;
    every root property; with ``keymap``, the XKB keymap dumped by ``xkbcomp``, ~10 ms: the
    baseline at start). Call :func:`watch` on ``display`` first."""
    keyboard = display.get_keyboard_control()
    pointer = display.get_pointer_control()
    saver = display.get_screen_saver()
    hosts = display.list_hosts()
    root = display.screen().root
    props = []
    for name in ROOT_PROPERTIES:
        prop = root.get_full_property(display.intern_atom(name), X.AnyPropertyType)
        value = None if prop is None else (prop.property_type, prop.format, _bytes(prop.value))
        props.append((name, value))
    xkb_state, xkb_controls = _xkb(display)
    return XState(
        pointer_mapping=tuple(display.get_pointer_mapping()),
        pointer_control=(pointer.accel_num, pointer.accel_denom, pointer.threshold),
        keyboard_control=(
            keyboard.global_auto_repeat,
            keyboard.key_click_percent,
            keyboard.bell_percent,
            keyboard.bell_pitch,
            keyboard.bell_duration,
            keyboard.led_mask,
            tuple(keyboard.auto_repeats),
        ),
        screen_saver=(saver.timeout, saver.interval, saver.prefer_blanking, saver.allow_exposures),
        font_path=tuple(display.get_font_path()),
        access=(hosts.mode, tuple((h.family, _bytes(h.name)) for h in hosts.hosts)),
        properties=tuple(props),
        selections=tuple(
            _id(display.get_selection_owner(display.intern_atom(name))) for name in SELECTIONS
        ),
        xkb_state=xkb_state,
        xkb_controls=xkb_controls,
        root=_root_properties(display) if keymap else (),
        spare_keycodes=_spare_keycodes(display) if keymap else frozenset(),
        keymap=_dump_keymap(display) if keymap else b"",
    )


def restore(display: Display, baseline: XState) -> list[str]:
    """Bring ``display``'s X server back to ``baseline`` (:func:`snapshot` at start); call
    it once the task's clients are gone. Returns the names of what differed and was set back
    (``["pointer_mapping", "xkb_state"]``; ``[]`` when nothing had changed;
    ``retained_clients`` when clients were killed, below). Always ends a screen saver that is
    on and the resources of clients that set their close-down mode to ``RetainTemporary``,
    and kills every client whose process is gone (:func:`kill_retained`: windows and
    resources kept by ``RetainPermanent``). Raises :class:`XStateError` naming what still
    differs afterwards."""
    request.KillClient(display=display.display, resource=X.AllTemporary)
    killed = kill_retained(display)
    display.force_screen_saver(X.ScreenSaverReset)
    now = snapshot(display)
    props, keymap_changed = _reported(display, baseline)
    changed = [name for name in COMPARED if getattr(now, name) != getattr(baseline, name)]
    changed += ["retained_clients"] if killed else []
    for name in changed:
        _SETTERS.get(name, _cannot)(display, now, baseline)
    if keymap_changed and baseline.keymap:
        _load_keymap(display, baseline.keymap)
        changed.append("xkb_keymap")
    if baseline.root and _restore_root(display, baseline, props):
        changed.append("root_properties")
    if not set(changed) - {"retained_clients", "xkb_keymap", "root_properties"}:
        return changed
    display.sync()
    after = snapshot(display)
    left = [name for name in COMPARED if getattr(after, name) != getattr(baseline, name)]
    if left:
        raise XStateError(f"the X server's {', '.join(left)} still differ from the desktop's start")
    return changed


def _reported(display: Display, baseline: XState) -> tuple[set[int], bool]:
    """The reports :func:`watch` asked for that came since the last call (the caller made a
    round trip first, so every change made before it is in): the atoms of the root-window
    properties that changed, and whether the XKB keymap changed beyond the keysyms of
    ``baseline``'s spare keycodes (what the desktop's own typing does)."""
    xkb = display.query_extension(XKB)
    xkb_event = xkb.first_event if xkb is not None else None
    atoms: set[int] = set()
    keymap = False
    while display.pending_events():
        ev = display.next_event()
        if ev.type == X.PropertyNotify:
            atoms.add(ev.atom)
        elif ev.type == xkb_event and not keymap:
            keymap = _keymap_event(ev, baseline.spare_keycodes)
    return atoms, keymap


def _keymap_event(ev, spare: frozenset[int]) -> bool:
    """Whether an XKB event (python-xlib's ``AnyEvent``: ``detail`` is the XKB event type,
    ``data`` bytes 4-31 of the event) changes the keymap beyond the keysyms, actions or
    behaviours of ``spare`` keycodes: a new keyboard, compat or indicator map, a key type,
    or any key that had keysyms at start."""
    if ev.detail != XKB_MAP_NOTIFY:
        return True
    data = bytes(ev.data)
    changed = data[6] | data[7] << 8
    if changed & XKB_KEY_TYPES and data[11]:
        return True
    # (first, count) of keysyms, actions, behaviours, explicit, modmap, vmodmap keys
    for i in range(12, 24, 2):
        first, count = data[i], data[i + 1]
        if any(code not in spare for code in range(first, first + count)):
            return True
    return False


def _root_properties(display: Display) -> tuple[tuple[str, tuple], ...]:
    """Every root-window property but :data:`WM_LIVE`: ``(name, (type, format, bytes))``,
    once the window manager set :data:`WM_STARTUP` (or :data:`WM_WAIT_S` passed)."""
    root = display.screen().root
    deadline = time.monotonic() + WM_WAIT_S
    while any(_value(display, n) is None for n in WM_STARTUP) and time.monotonic() < deadline:
        time.sleep(0.01)
    out = []
    for atom in root.list_properties():
        name = display.get_atom_name(atom)
        if name in WM_LIVE:
            continue
        prop = root.get_full_property(atom, X.AnyPropertyType)
        if prop is not None:
            out.append((name, (prop.property_type, prop.format, _bytes(prop.value))))
    return tuple(out)


def _restore_root(display: Display, baseline: XState, reported: set[int]) -> bool:
    """Delete the root properties that were not there at start, ask the window manager for
    :data:`WM_ASKED` and wait for it (it rewrites the desktops' names, work area...), then
    write back the other properties reported changed. Returns whether anything was done;
    raises :class:`XStateError` when a property still differs afterwards."""
    root = display.screen().root
    start = dict(baseline.root)
    atoms = {display.intern_atom(name): name for name in start}
    done = False
    for atom in root.list_properties():
        if atom not in atoms and display.get_atom_name(atom) not in WM_LIVE:
            root.delete_property(atom)
            done = True
    names = {atoms[a] for a in reported if a in atoms}
    asked = [n for n in WM_ASKED if n in names and _value(display, n) != start[n]]
    for name in asked:
        _ask_wm(display, name, int.from_bytes(start[name][2][:4], "little"))
        deadline = time.monotonic() + WM_WAIT_S
        while _value(display, name) != start[name] and time.monotonic() < deadline:
            time.sleep(0.01)
    display.sync()
    while display.pending_events():  # what the window manager changed meanwhile
        ev = display.next_event()
        if ev.type == X.PropertyNotify and ev.atom in atoms:
            names.add(atoms[ev.atom])
    for name in names - set(WM_ASKED):
        if _value(display, name) != start[name]:
            kind, fmt, data = start[name]
            root.change_property(display.intern_atom(name), kind, fmt, data)
            done = True
    display.sync()
    while display.pending_events():  # the reports of the writes above
        display.next_event()
    left = [n for n in sorted(names) if _value(display, n) != start[n]]
    if left:
        raise XStateError(f"the root window's {', '.join(left)} still differ from the start")
    return done or bool(asked)


def _value(display: Display, name: str) -> tuple | None:
    prop = display.screen().root.get_full_property(display.intern_atom(name), X.AnyPropertyType)
    return None if prop is None else (prop.property_type, prop.format, _bytes(prop.value))


def _ask_wm(display: Display, name: str, value: int) -> None:
    """The EWMH client message that asks the window manager to set ``name`` to ``value``
    (what ``wmctrl -n``/``-s`` send)."""
    root = display.screen().root
    message = event.ClientMessage(
        window=root,
        client_type=display.intern_atom(name),
        data=(32, [value, X.CurrentTime, 0, 0, 0]),
    )
    mask = X.SubstructureRedirectMask | X.SubstructureNotifyMask
    root.send_event(message, event_mask=mask)


def _spare_keycodes(display: Display) -> frozenset[int]:
    first = display.display.info.min_keycode
    count = display.display.info.max_keycode - first + 1
    mapping = display.get_keyboard_mapping(first, count)
    return frozenset(first + i for i, syms in enumerate(mapping) if not any(syms))


def _xkbcomp(argv: list[str], data: bytes | None = None) -> None:
    try:
        done = subprocess.run(
            ["xkbcomp", "-w0", *argv],
            input=data,
            capture_output=True,
            timeout=XKBCOMP_TIMEOUT_S,
            env={},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise XStateError(f"xkbcomp failed: {exc}") from None
    if done.returncode != 0:
        raise XStateError(f"xkbcomp failed: {done.stderr.decode(errors='replace')[-300:]}")


def _dump_keymap(display: Display) -> bytes:
    """The XKB keymap of ``display`` as ``xkbcomp -xkb`` writes it (b"": no XKB, or no
    ``xkbcomp`` on the host: the keymap is then not watched)."""
    if _xkb_opcode(display) is None:
        return b""
    with tempfile.TemporaryDirectory(prefix="legato-xkb-") as tmp:
        path = os.path.join(tmp, "keymap.xkb")
        try:
            _xkbcomp(["-xkb", display.get_display_name(), path])
        except XStateError:
            return b""
        with open(path, "rb") as f:
            return f.read()


def _canonical(keymap: bytes) -> list[bytes]:
    """A keymap dump's lines without what differs between dumps of the same keymap, once
    loaded from a file: the components' names (``"pc+us"`` or ``"pc_us"``) and a key type's
    map entries to ``Level1`` (the default level, written or left out)."""
    return [
        line
        for line in keymap.splitlines()
        if not re.match(rb"\s*xkb_\w+ \".*\" \{$", line)
        and not re.match(rb"\s*map\[.*\]= Level1;$", line)
    ]


def _load_keymap(display: Display, keymap: bytes) -> None:
    """Load ``keymap`` (a :func:`_dump_keymap`) into the X server and check a fresh dump is
    the same; the reports of the load itself are read off. Raises :class:`XStateError`."""
    _xkbcomp(["-", display.get_display_name()], keymap)
    display.sync()
    while display.pending_events():
        display.next_event()
    if _canonical(_dump_keymap(display)) != _canonical(keymap):
        raise XStateError("the XKB keymap still differs from the desktop's start after xkbcomp")


def kill_retained(display: Display) -> int:
    """Kill the X clients whose process no longer runs: a client that set its close-down mode
    to ``RetainPermanent`` keeps its windows (a mapped override-redirect window over the whole
    screen, say) after its process ends, until the server restarts. The X-Resource
    extension's ``QueryClientIds`` tells each client's host pid (kept for a retained client);
    the server's own entry (resource base 0) and clients without a pid are left alone.
    Returns how many were killed (0 without X-Resource)."""
    try:
        reply = display.res_query_client_ids([{"client": 0, "mask": res.LocalClientPIDMask}])
    except AttributeError:  # no X-Resource extension
        return 0
    killed = 0
    for entry in reply.ids:
        base = entry.spec.client
        if not base or not entry.spec.mask & res.LocalClientPIDMask or not entry.value:
            continue
        try:
            os.kill(int(entry.value[0]), 0)
        except ProcessLookupError:
            request.KillClient(display=display.display, resource=base)
            killed += 1
        except PermissionError:  # alive, another user's
            pass
    return killed


def _cannot(display: Display, now: XState, baseline: XState) -> None:
    """No setter (the XKB controls): :func:`restore` then reports it as still differing."""


def _set_pointer_mapping(display: Display, now: XState, baseline: XState) -> None:
    if display.set_pointer_mapping(list(baseline.pointer_mapping)) != X.MappingSuccess:
        raise XStateError("the pointer button map could not be set back (a button is held)")


def _set_pointer_control(display: Display, now: XState, baseline: XState) -> None:
    num, denom, threshold = baseline.pointer_control
    display.change_pointer_control(accel=(num, denom), threshold=threshold)


def _set_keyboard_control(display: Display, now: XState, baseline: XState) -> None:
    auto, click, bell, pitch, duration, leds, per_key = baseline.keyboard_control
    display.change_keyboard_control(
        key_click_percent=click,
        bell_percent=bell,
        bell_pitch=pitch,
        bell_duration=duration,
        auto_repeat_mode=X.AutoRepeatModeOn if auto else X.AutoRepeatModeOff,
    )
    for byte, (was, wanted) in enumerate(zip(now.keyboard_control[6], per_key, strict=True)):
        for bit in range(8):
            if (was ^ wanted) >> bit & 1:
                on = wanted >> bit & 1
                display.change_keyboard_control(
                    key=byte * 8 + bit,
                    auto_repeat_mode=X.AutoRepeatModeOn if on else X.AutoRepeatModeOff,
                )
    for led in range(32):
        if (now.keyboard_control[5] ^ leds) >> led & 1:
            display.change_keyboard_control(
                led=led + 1, led_mode=X.LedModeOn if leds >> led & 1 else X.LedModeOff
            )


def _set_screen_saver(display: Display, now: XState, baseline: XState) -> None:
    display.set_screen_saver(*baseline.screen_saver)


def _set_font_path(display: Display, now: XState, baseline: XState) -> None:
    display.set_font_path(list(baseline.font_path))


def _set_access(display: Display, now: XState, baseline: XState) -> None:
    mode, hosts = baseline.access
    display.set_access_control(X.EnableAccess if mode else X.DisableAccess)
    for family, address in set(now.access[1]) - set(hosts):
        display.change_hosts(X.HostDelete, family, list(address))
    for family, address in set(hosts) - set(now.access[1]):
        display.change_hosts(X.HostInsert, family, list(address))


def _set_properties(display: Display, now: XState, baseline: XState) -> None:
    root = display.screen().root
    for (name, value), (_, was) in zip(baseline.properties, now.properties, strict=True):
        if value == was:
            continue
        atom = display.intern_atom(name)
        if value is None:
            root.delete_property(atom)
        else:
            kind, fmt, data = value
            root.change_property(atom, kind, fmt, data)


def _clear_selections(display: Display, now: XState, baseline: XState) -> None:
    for name, owner in zip(SELECTIONS, now.selections, strict=True):
        if owner != X.NONE:
            request.SetSelectionOwner(
                display=display.display,
                window=X.NONE,
                selection=display.intern_atom(name),
                time=X.CurrentTime,
            )


def _set_xkb_state(display: Display, now: XState, baseline: XState) -> None:
    latched, locked, locked_group = baseline.xkb_state[:3]
    _LatchLockState(
        display=display.display,
        opcode=_xkb_opcode(display),
        device=XKB_USE_CORE_KBD,
        affect_mod_locks=0xFF,
        mod_locks=locked,
        lock_group=True,
        group_lock=locked_group,
        affect_mod_latches=0xFF,
        mod_latches=latched,
        latch_group=False,
        group_latch=0,
    )


_SETTERS = {
    "pointer_mapping": _set_pointer_mapping,
    "pointer_control": _set_pointer_control,
    "keyboard_control": _set_keyboard_control,
    "screen_saver": _set_screen_saver,
    "font_path": _set_font_path,
    "access": _set_access,
    "properties": _set_properties,
    "selections": _clear_selections,
    "xkb_state": _set_xkb_state,
}


def _xkb(display: Display) -> tuple[bytes, bytes]:
    """XKB's latched and locked modifiers, locked and latched group (bytes 2, 3, 5, 8-9 of the
    ``GetState`` reply's body: not the effective or base modifiers nor the buttons, which keys
    and buttons held make), and its controls (the ``GetControls`` reply's body: repeat rate,
    sticky/slow/bounce/mouse keys, AccessX, per-key repeat); ``(b"", b"")`` when the server
    has no XKB. Announces XKB on the connection once (the server
    refuses other XKB requests before ``UseExtension``)."""
    opcode = _xkb_opcode(display)
    if opcode is None:
        return b"", b""
    state = _GetState(display=display.display, opcode=opcode, device=XKB_USE_CORE_KBD).data
    controls = _GetControls(display=display.display, opcode=opcode, device=XKB_USE_CORE_KBD).data
    state = bytes(state)
    return state[2:4] + state[5:6] + state[8:10], bytes(controls)


def _xkb_opcode(display: Display) -> int | None:
    """XKB's major opcode on ``display`` (``None``: no XKB), announcing XKB on the connection
    the first time (the server refuses other XKB requests before ``UseExtension``)."""
    known = getattr(display, "_legato_xkb", False)
    if known is False:
        info = display.query_extension(XKB)
        known = info.major_opcode if info is not None else None
        if known is not None:
            _UseExtension(display=display.display, opcode=known, major=1, minor=0)
        display._legato_xkb = known
    return known


def _id(owner) -> int:
    """A window's id (python-xlib answers a Window object, or 0 for none)."""
    return int(getattr(owner, "id", owner) or 0)


def _bytes(value) -> bytes:
    """A property value or host address as bytes (python-xlib answers str, bytes or arrays)."""
    if isinstance(value, str):
        return value.encode("latin-1")
    if isinstance(value, bytes):
        return value
    return bytes(bytearray(value)) if not hasattr(value, "tobytes") else value.tobytes()
