"""Types what pyautogui cannot, inside the desktop's own ``python`` (OSWorld's ``/execute``).

Not imported by the project: :func:`~legato_pipelines.harness.render.render_osworld_code` puts
this file's source into a ``type`` action's code, which runs as ``python -c "import pyautogui;
...; <code>"`` on the VM. It needs only what pyautogui itself needs on X11 (python-xlib).

pyautogui's X11 table holds printable ASCII only and silently skips every other character
(``Spaß`` arrives as ``Spa``). :class:`LegatoTyper` types such characters as xdotool does:
each one's keysym (Latin-1 keysyms equal the code point, others are ``0x01000000 + code
point``) is put on a keycode the keymap leaves empty, checked, pressed with XTest, and the
keycodes are emptied again at the end. Clients re-read the keymap when it changes, so every
remapping is followed by a short settle before a key is pressed.

What cannot be typed (no X display or python-xlib, no empty keycode, a control character)
is skipped and named on stdout as ``LEGATO_NOT_TYPED <json string>``; the desktop backend
records it on the action (``not_typed``) instead of pretending the text arrived.
"""

import json
import time

NOT_TYPED_MARK = "LEGATO_NOT_TYPED "
SETTLE_S = 0.1  # seconds for clients to re-read the keymap after it changed


def legato_keysym(char):
    """The X keysym of one character, or None for a control character."""
    code = ord(char)
    if code < 0x20 or 0x7F <= code < 0xA0:
        return None
    if code <= 0xFF:
        return code
    return 0x01000000 + code


class LegatoTyper:
    """Types characters on spare keycodes of the X display in ``DISPLAY``; ``chars`` are the
    characters to come (mapped up front, so one settle covers most texts)."""

    def __init__(self, chars):
        self.untyped = []
        self.codes = {}  # char -> keycode it is mapped on
        self.spare = []
        self.display = None
        try:
            from Xlib import X
            from Xlib.display import Display
            from Xlib.ext import xtest

            self.X, self.xtest = X, xtest
            self.display = Display()
            first = self.display.display.info.min_keycode
            count = self.display.display.info.max_keycode - first + 1
            mapping = self.display.get_keyboard_mapping(first, count)
            self.spare = [first + i for i, syms in enumerate(mapping) if not any(syms)]
        except Exception:  # no display, no python-xlib: nothing can be typed this way
            self.display = None
        self.map(chars)

    def map(self, chars):
        """Put the not yet mapped characters of ``chars`` on spare keycodes (as many as fit;
        the previous ones are dropped when the spares run out), check the keymap, settle."""
        wanted = [
            c for c in dict.fromkeys(chars) if c not in self.codes and legato_keysym(c) is not None
        ]
        if self.display is None or not wanted or not self.spare:
            return
        free = [code for code in self.spare if code not in self.codes.values()]
        if len(free) < min(len(wanted), len(self.spare)):
            time.sleep(SETTLE_S)  # the keys pressed last must be read with the old keymap
            self.codes, free = {}, list(self.spare)
        for char, code in zip(wanted, free):  # noqa: B905 (the VM's python may predate 3.10)
            sym = legato_keysym(char)
            self.display.change_keyboard_mapping(code, [(sym, sym)])
            self.codes[char] = code
        self.display.sync()
        for char, code in list(self.codes.items()):
            if self.display.get_keyboard_mapping(code, 1)[0][0] != legato_keysym(char):
                del self.codes[char]
        time.sleep(SETTLE_S)

    def type(self, text, interval):
        """Type ``text``, ``interval`` seconds after each character (pyautogui's spacing)."""
        for i, char in enumerate(text):
            if char not in self.codes:
                self.map(text[i:])
            code = self.codes.get(char)
            if code is None:
                self.untyped.append(char)
                continue
            self.xtest.fake_input(self.display, self.X.KeyPress, code)
            self.xtest.fake_input(self.display, self.X.KeyRelease, code)
            self.display.sync()
            time.sleep(interval)

    def close(self):
        """Empty the keycodes used (after a settle: the last keys must be read first) and
        name on stdout what was not typed."""
        if self.display is not None:
            if self.codes:
                time.sleep(SETTLE_S)
                for code in self.codes.values():
                    self.display.change_keyboard_mapping(code, [(0, 0)])
                self.display.sync()
            self.display.close()
        if self.untyped:
            print(NOT_TYPED_MARK + json.dumps("".join(self.untyped)), flush=True)
