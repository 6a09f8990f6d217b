"""Key names of ``computer_use`` ``key`` actions, normalized to pyautogui's names.

Models write keys many ways ("Return", "enter", "Ctrl", "control", "Page_Down", "cmd").
pyautogui (what OSWorld's ``/execute`` runs) lower-cases multi-character names itself and
silently ignores names it does not know, so an unknown name would be a no-op on OSWorld.
Here every name is mapped case-insensitively to one canonical pyautogui name (the X11 key
table of pyautogui 0.9.54), and an unknown name is reported instead of dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

# pyautogui KEY_NAMES (multi-character ones); synonyms collapse to one canonical name below.
_PYAUTOGUI_NAMES = frozenset(
    """
    accept add alt altleft altright apps backspace browserback browserfavorites browserforward
    browserhome browserrefresh browsersearch browserstop capslock clear convert ctrl ctrlleft
    ctrlright decimal delete divide down end enter esc execute final fn hanguel hangul hanja
    help home insert junja kana kanji launchapp1 launchapp2 launchmail launchmediaselect left
    modechange multiply nexttrack nonconvert num0 num1 num2 num3 num4 num5 num6 num7 num8 num9
    numlock pagedown pageup pause playpause prevtrack print printscreen right scrolllock select
    separator shift shiftleft shiftright sleep space stop subtract tab up volumedown volumemute
    volumeup win winleft winright yen
    """.split()
) | frozenset(f"f{i}" for i in range(1, 25))

# Synonyms (lower case, separators removed) -> canonical pyautogui name.
_ALIASES: dict[str, str] = {
    "return": "enter",
    "kpenter": "enter",
    "control": "ctrl",
    "controll": "ctrlleft",
    "controlr": "ctrlright",
    "lctrl": "ctrlleft",
    "rctrl": "ctrlright",
    "escape": "esc",
    "del": "delete",
    "pgup": "pageup",
    "prior": "pageup",
    "pgdn": "pagedown",
    "pgdown": "pagedown",
    "next": "pagedown",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "uparrow": "up",
    "downarrow": "down",
    "leftarrow": "left",
    "rightarrow": "right",
    "bksp": "backspace",
    "ins": "insert",
    "caps": "capslock",
    "spacebar": "space",
    "prtsc": "printscreen",
    "prtscr": "printscreen",
    "prntscrn": "printscreen",
    "printscr": "printscreen",
    "sysrq": "printscreen",
    "menu": "apps",
    "contextmenu": "apps",
    # The OSWorld desktops are Ubuntu: pyautogui's X11 table maps only "win*" to Super.
    "super": "win",
    "superl": "winleft",
    "superr": "winright",
    "meta": "win",
    "cmd": "win",
    "command": "win",
    "windows": "win",
    "lwin": "winleft",
    "rwin": "winright",
    "option": "alt",
    "optionleft": "altleft",
    "optionright": "altright",
    "altl": "altleft",
    "altr": "altright",
    "lalt": "altleft",
    "ralt": "altright",
    "altgr": "altright",
    "shiftl": "shiftleft",
    "shiftr": "shiftright",
    "lshift": "shiftleft",
    "rshift": "shiftright",
    # Names of single characters.
    "plus": "+",
    "minus": "-",
    "equal": "=",
    "equals": "=",
    "comma": ",",
    "period": ".",
    "dot": ".",
    "slash": "/",
    "backslash": "\\",
    "semicolon": ";",
    "colon": ":",
    "apostrophe": "'",
    "quote": "'",
    "grave": "`",
    "backtick": "`",
    "bracketleft": "[",
    "bracketright": "]",
    "asterisk": "*",
}

MODIFIERS = frozenset(
    {
        "ctrl",
        "ctrlleft",
        "ctrlright",
        "alt",
        "altleft",
        "altright",
        "shift",
        "shiftleft",
        "shiftright",
        "win",
        "winleft",
        "winright",
    }  # fmt: skip
)


class KeyNameError(ValueError):
    """A key name no pyautogui key matches. The message names the key."""


def normalize_key(name: str) -> str:
    """The canonical pyautogui name of one key (multi-character names; case-insensitive).

    Single characters are returned unchanged. Raises :class:`KeyNameError` for an unknown name.
    """
    if len(name) == 1:
        return name
    low = name.strip().lower()
    if len(low) == 1:
        return low
    if low in _PYAUTOGUI_NAMES:
        return low
    squashed = low.replace("_", "").replace(" ", "").replace("-", "")
    if squashed in _PYAUTOGUI_NAMES:
        return squashed
    if squashed in _ALIASES:
        return _ALIASES[squashed]
    raise KeyNameError(f"unknown key name {name[:40]!r}")


def normalize_keys(keys: Sequence[str]) -> tuple[str, ...]:
    """Normalize a chord: each name via :func:`normalize_key`; "ctrl+s" items are split.

    Single letters are lower-cased when the chord holds a modifier (Ctrl+Shift+T names the
    physical T key); alone they stay as given (pyautogui presses "A" as Shift+a).
    Raises :class:`KeyNameError` for an unknown or empty name.
    """
    names: list[str] = []
    for item in keys:
        parts = _split_chord(item)
        for part in parts:
            if part == "" or (len(part) > 1 and not part.strip()):
                raise KeyNameError(f"empty key name in {item!r}")
            names.append(normalize_key(part))
    if len(names) > 1 and any(n in MODIFIERS for n in names):
        names = [n.lower() if len(n) == 1 else n for n in names]
    return tuple(names)


def _split_chord(item: str) -> list[str]:
    """ "ctrl+s" -> ["ctrl", "s"]; "+" and "ctrl++" keep the plus key itself."""
    if "+" not in item or item.strip() == "+":
        return [item]
    if item.endswith("++"):
        return [*item[:-2].split("+"), "+"]
    return item.split("+")
