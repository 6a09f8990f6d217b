"""Structured actions as XTest input events (python-xlib): never model text run as code.

XTest calls take 0.2-2.5 ms where an ``xdotool`` process takes 28-104 ms (docs/local-desktop.md
§5). Keys are mapped keysym -> keycode from the server's keyboard map, with Shift pressed for
keysyms on a keycode's shifted level; the map is re-read before a keystroke when the server
announced a change (a layout switched inside the desktop: ``setxkbmap de``). A character
without any keycode (``é``, ``→``) is put on a spare keycode with ``ChangeKeyboardMapping``
first (what xdotool does).

Semantics follow pyautogui as OSWorld's Qwen agents use it: ``scroll(pixels)`` presses the
wheel ``|pixels|`` times (positive = up); ``left_click_drag`` drags from the current pointer
position to the target; ``type`` types the text verbatim, a newline presses Return.
Before keystrokes the newest window is focused when no window has the focus (openbox drops
the focus on a click on the empty desktop).
"""

from __future__ import annotations

import time

from Xlib import XK, X
from Xlib.display import Display
from Xlib.ext import xtest

from ...actions import Action
from .windows import Windows

MAX_SCROLL_CLICKS = 200
DRAG_STEPS = 12
DRAG_STEP_S = 0.01
#: Seconds before typing the same character again. Typed without a gap, ``pre.pptx`` in
#: LibreOffice Impress's Save As dialog arrived as ``pre.ptx`` (3 runs of 3; with the gap the
#: task scored 1). Likely cause: the X server stamps events in milliseconds, and a release and
#: a new press of one key at the same time look like autorepeat to LibreOffice's X11 backend.
REPEAT_GAP_S = 0.003

#: Key names (pyautogui's, lower-cased, and common aliases) -> X keysym names.
KEY_NAMES: dict[str, str] = {
    "ctrl": "Control_L",
    "control": "Control_L",
    "ctrlleft": "Control_L",
    "ctrlright": "Control_R",
    "shift": "Shift_L",
    "shiftleft": "Shift_L",
    "shiftright": "Shift_R",
    "alt": "Alt_L",
    "altleft": "Alt_L",
    "altright": "Alt_R",
    "option": "Alt_L",
    "optionleft": "Alt_L",
    "optionright": "Alt_R",
    "altgr": "ISO_Level3_Shift",
    "win": "Super_L",
    "winleft": "Super_L",
    "winright": "Super_R",
    "super": "Super_L",
    "cmd": "Super_L",
    "command": "Super_L",
    "meta": "Meta_L",
    "enter": "Return",
    "return": "Return",
    "\n": "Return",
    "\r": "Return",
    "kp_enter": "KP_Enter",
    "esc": "Escape",
    "escape": "Escape",
    "tab": "Tab",
    "\t": "Tab",
    "backspace": "BackSpace",
    "delete": "Delete",
    "del": "Delete",
    "insert": "Insert",
    "space": "space",
    " ": "space",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "arrowup": "Up",
    "arrowdown": "Down",
    "arrowleft": "Left",
    "arrowright": "Right",
    "home": "Home",
    "end": "End",
    "pageup": "Prior",
    "pgup": "Prior",
    "page_up": "Prior",
    "pagedown": "Next",
    "pgdn": "Next",
    "page_down": "Next",
    "capslock": "Caps_Lock",
    "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock",
    "printscreen": "Print",
    "prtsc": "Print",
    "prtscr": "Print",
    "prntscrn": "Print",
    "print": "Print",
    "pause": "Pause",
    "menu": "Menu",
    "apps": "Menu",
    "volumeup": "XF86AudioRaiseVolume",
    "volumedown": "XF86AudioLowerVolume",
    "volumemute": "XF86AudioMute",
    "playpause": "XF86AudioPlay",
    "plus": "plus",
    "minus": "minus",
    "comma": "comma",
    "period": "period",
    "add": "KP_Add",
    "subtract": "KP_Subtract",
    "multiply": "KP_Multiply",
    "divide": "KP_Divide",
    "decimal": "KP_Decimal",
    "separator": "KP_Separator",
    **{f"f{i}": f"F{i}" for i in range(1, 25)},
    **{f"num{i}": f"KP_{i}" for i in range(10)},
}
BUTTONS = {"left_click": 1, "middle_click": 2, "right_click": 3}


class InputError(ValueError):
    """An action cannot be turned into input (unknown key name, missing coordinate)."""


def keysym_for(name: str) -> int:
    """The X keysym of a key name (``ctrl``, ``Return``, ``a``, ``A``, ``é``, ``F5``).

    Raises :class:`InputError` for an unknown name.
    """
    if name in KEY_NAMES:
        return XK.string_to_keysym(KEY_NAMES[name])
    lowered = name.lower()
    if len(name) > 1 and lowered in KEY_NAMES:
        return XK.string_to_keysym(KEY_NAMES[lowered])
    if len(name) == 1:
        return char_keysym(name)
    keysym = XK.string_to_keysym(name)
    if keysym == X.NoSymbol:
        keysym = XK.string_to_keysym(name.capitalize())
    if keysym == X.NoSymbol:
        raise InputError(
            f"unknown key name {name!r} (use pyautogui names: ctrl, shift, alt, enter, esc, f5, a, ...)"
        )
    return keysym


def char_keysym(char: str) -> int:
    """The keysym of one character: Latin-1 keysyms equal the code point; others are
    ``0x01000000 + code point`` (X11 Unicode keysyms)."""
    if char in KEY_NAMES:
        return XK.string_to_keysym(KEY_NAMES[char])
    code = ord(char)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 + code


class Keyboard:
    """keysym -> (keycode, needs Shift), with spare keycodes for unmapped keysyms.

    The map is the server's current keymap, read here (python-xlib's own cache is the one of
    connection time and never follows a change), and read again by :meth:`refresh` when the
    server announced a change: a layout switched inside the desktop (``setxkbmap de``),
    ``xmodmap``, or a spare keycode this class mapped.
    """

    def __init__(self, display: Display):
        self.d = display
        self._remapped: dict[int, int] = {}  # keysym -> spare keycode
        self._next_spare = 0
        self._load()

    def _load(self) -> None:
        first = self.d.display.info.min_keycode
        count = self.d.display.info.max_keycode - first + 1
        mapping = self.d.get_keyboard_mapping(first, count)
        self._codes: dict[int, tuple[int, int]] = {}  # keysym -> (level index, keycode), lowest
        for i, syms in enumerate(mapping):
            for index, keysym in enumerate(syms[:2]):  # group 1, levels 1-2 (Shift)
                if keysym and (index, first + i) < self._codes.get(keysym, (9, 1 << 16)):
                    self._codes[keysym] = (index, first + i)
        empty = {first + i for i, syms in enumerate(mapping) if not any(syms)}
        # spares this class mapped and that still hold their keysym stay in use (and reusable)
        self._remapped = {k: c for k, c in self._remapped.items() if mapping[c - first][0] == k}
        self._spare = sorted(empty | set(self._remapped.values()))
        self.shift = self.lookup(XK.string_to_keysym("Shift_L"))[0]

    def refresh(self) -> bool:
        """Re-read the keymap if the server announced a change since the last call
        (``MappingNotify``, delivered to every client); returns whether it did. One round
        trip (``sync``) makes sure the announcements of changes made before now have arrived."""
        self.d.sync()
        changed = False
        while self.d.pending_events():
            ev = self.d.next_event()
            if ev.type == X.MappingNotify and ev.request in (
                X.MappingKeyboard,
                X.MappingModifier,
            ):
                changed = True
        if changed:
            self._load()
        return changed

    def lookup(self, keysym: int) -> tuple[int, bool]:
        """(keycode, needs_shift) for ``keysym``; maps it onto a spare keycode if needed."""
        if keysym in self._remapped:
            return self._remapped[keysym], False
        found = self._codes.get(keysym)
        if found is not None:
            return found[1], found[0] == 1
        if not self._spare:
            raise InputError(f"no spare keycode to type keysym {keysym:#x}")
        keycode = self._spare[self._next_spare % len(self._spare)]
        self._next_spare += 1
        for old, code in list(self._remapped.items()):
            if code == keycode:
                del self._remapped[old]
        self.d.change_keyboard_mapping(keycode, [(keysym, keysym)])
        self.d.sync()
        self._remapped[keysym] = keycode
        return keycode, False


class Input:
    """Executes :class:`~legato_pipelines.actions.Action` values on one display (X thread only)."""

    def __init__(self, display: Display, windows: Windows):
        self.d = display
        self.windows = windows
        self.keyboard = Keyboard(display)
        screen = display.screen()
        self.size = (screen.width_in_pixels, screen.height_in_pixels)

    # -- primitives ------------------------------------------------------------------------------

    def move(self, x: int, y: int) -> None:
        xtest.fake_input(self.d, X.MotionNotify, x=int(x), y=int(y))

    def button(self, button: int, count: int = 1) -> None:
        for _ in range(count):
            xtest.fake_input(self.d, X.ButtonPress, button)
            xtest.fake_input(self.d, X.ButtonRelease, button)

    def chord(self, keysyms: list[int]) -> None:
        """Press the keys in order, release them in reverse (Shift added where a key needs it)."""
        codes: list[int] = []
        for keysym in keysyms:
            keycode, needs_shift = self.keyboard.lookup(keysym)
            if needs_shift and self.keyboard.shift not in codes:
                codes.append(self.keyboard.shift)
            codes.append(keycode)
        try:
            for code in codes:
                xtest.fake_input(self.d, X.KeyPress, code)
        finally:
            for code in reversed(codes):
                xtest.fake_input(self.d, X.KeyRelease, code)

    def type_text(self, text: str) -> None:
        """Type ``text`` character by character (``\\n`` and ``\\r\\n`` press Return)."""
        previous = None
        for char in text.replace("\r\n", "\n"):
            if char == previous:  # LibreOffice takes an instant repeat for autorepeat
                time.sleep(REPEAT_GAP_S)
            self.chord([char_keysym(char)])
            self.d.sync()
            previous = char

    def release_all(self) -> None:
        """Release every key and button that is down (after a reset or a failed action)."""
        keymap = self.d.query_keymap()
        for byte_index, byte in enumerate(keymap):
            for bit in range(8):
                if byte & (1 << bit):
                    xtest.fake_input(self.d, X.KeyRelease, byte_index * 8 + bit)
        pointer = self.d.screen().root.query_pointer()
        for button, mask in ((1, X.Button1Mask), (2, X.Button2Mask), (3, X.Button3Mask)):
            if pointer.mask & mask:
                xtest.fake_input(self.d, X.ButtonRelease, button)
        self.d.sync()

    def pointer(self) -> tuple[int, int]:
        p = self.d.screen().root.query_pointer()
        return (p.root_x, p.root_y)

    # -- actions -----------------------------------------------------------------------------------

    def perform(self, action: Action) -> None:
        """Execute one action. ``wait`` and ``terminate`` do nothing here.

        Raises :class:`InputError` for an unknown action, a missing coordinate or key name.
        """
        name = action.action
        if name in BUTTONS or name in ("double_click", "mouse_move", "left_click_drag"):
            x, y = self._target(action)
            if name == "left_click_drag":
                self._drag(x, y)
            else:
                self.move(x, y)
                if name == "double_click":
                    self.button(1, 2)
                elif name in BUTTONS:
                    self.button(BUTTONS[name])
        elif name == "type":
            if action.text is None:
                raise InputError("type: field 'text' is missing")
            self.windows.ensure_focus()
            self.keyboard.refresh()  # the layout may have changed since the last keystroke
            self.type_text(action.text)
        elif name == "key":
            if not action.keys:
                raise InputError("key: field 'keys' is empty")
            keysyms = [keysym_for(k) for k in action.keys]
            self.windows.ensure_focus()
            self.keyboard.refresh()
            self.chord(keysyms)
        elif name == "scroll":
            if action.x is not None and action.y is not None:
                self.move(action.x, action.y)
            pixels = int(action.pixels or 0)
            self.button(4 if pixels > 0 else 5, min(abs(pixels), MAX_SCROLL_CLICKS))
        elif name not in ("wait", "terminate"):
            raise InputError(f"unknown action {name!r}")
        self.d.sync()

    def _target(self, action: Action) -> tuple[int, int]:
        if action.x is None or action.y is None:
            raise InputError(f"{action.action}: needs screen coordinates x, y")
        width, height = self.size
        return (min(max(int(action.x), 0), width - 1), min(max(int(action.y), 0), height - 1))

    def _drag(self, x: int, y: int) -> None:
        x0, y0 = self.pointer()
        xtest.fake_input(self.d, X.ButtonPress, 1)
        self.d.sync()
        try:
            for i in range(1, DRAG_STEPS + 1):
                self.move(x0 + (x - x0) * i // DRAG_STEPS, y0 + (y - y0) * i // DRAG_STEPS)
                self.d.sync()
                time.sleep(DRAG_STEP_S)
        finally:
            xtest.fake_input(self.d, X.ButtonRelease, 1)
