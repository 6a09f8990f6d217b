"""The desktop's keyboard layout: recorded when the desktop starts, restored by every reset.

A task (or the policy: ``setxkbmap de`` in a terminal) can switch the X keyboard layout; the
layout lives in the X server, so neither a HOME restore nor killing the task's processes
undoes it, and every later attempt on that desktop would type under it. The baseline is the
XKB rule names (``_XKB_RULES_NAMES`` on the root window: rules, model, layout, variant,
options, what ``setxkbmap -query`` prints) and the core keymap of the keycodes that had
keysyms at start (the empty ones are spares that XTest typing maps characters onto) plus the
modifier map. A reset that finds them changed runs ``setxkbmap`` with the baseline's names
(x11-xkb-utils, which Xvfb itself depends on), which recompiles the whole keymap, xmodmap
changes included, and checks the result (docs/local-desktop.md §5).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from Xlib import Xatom
from Xlib.display import Display

SETXKBMAP_TIMEOUT_S = 10.0
NAMES = ("rules", "model", "layout", "variant", "options")


class KeymapError(RuntimeError):
    """The baseline layout could not be restored (the message says why)."""


@dataclass(frozen=True, slots=True)
class KeyboardState:
    """The XKB rule names (:data:`NAMES` order) and a snapshot of the core keymap:
    ``keycodes`` (those the snapshot covers), their keysyms, and the modifier map."""

    names: tuple[str, ...]
    keycodes: tuple[int, ...]
    keysyms: tuple[tuple[int, ...], ...]
    modifiers: tuple[tuple[int, ...], ...]

    @property
    def layout(self) -> str:
        """The layout (and variant) as ``setxkbmap -query`` names it, e.g. ``de`` or ``us(intl)``."""
        layout, variant = self.names[2], self.names[3]
        return f"{layout}({variant})" if variant else layout or "?"

    def same_keyboard(self, other: KeyboardState) -> bool:
        return (self.names, self.keysyms, self.modifiers) == (
            other.names,
            other.keysyms,
            other.modifiers,
        )


def keyboard_state(display: Display, keycodes: tuple[int, ...] | None = None) -> KeyboardState:
    """The keyboard of ``display`` now. ``keycodes``: the keycodes to snapshot (a baseline's,
    so both cover the same keys); ``None``: every keycode that has a keysym now."""
    first = display.display.info.min_keycode
    count = display.display.info.max_keycode - first + 1
    mapping = display.get_keyboard_mapping(first, count)
    if keycodes is None:
        keycodes = tuple(first + i for i, syms in enumerate(mapping) if any(syms))
    keysyms = tuple(tuple(mapping[code - first]) for code in keycodes)
    modifiers = tuple(tuple(codes) for codes in display.get_modifier_mapping())
    prop = display.screen().root.get_full_property(
        display.intern_atom("_XKB_RULES_NAMES"), Xatom.STRING
    )
    raw = prop.value if prop is not None else b""
    raw = raw.encode("latin-1") if isinstance(raw, str) else bytes(raw)
    names = tuple((raw.split(b"\0") + [b""] * len(NAMES))[: len(NAMES)])
    return KeyboardState(
        tuple(n.decode("latin-1") for n in names), tuple(keycodes), keysyms, modifiers
    )


def restore_keyboard(display: Display, display_name: str, baseline: KeyboardState) -> str | None:
    """Bring the keyboard of ``display`` (named ``display_name``, e.g. ``:20``) back to
    ``baseline`` when it changed. Returns what was restored (``"layout de -> us"``, or
    ``"keymap of us"`` when only keys were remapped), ``None`` when nothing had changed.

    Raises :class:`KeymapError` when ``setxkbmap`` fails or the keyboard still differs.
    """
    now = keyboard_state(display, baseline.keycodes)
    if now.same_keyboard(baseline):
        return None
    rules, model, layout, variant, options = baseline.names
    argv = ["setxkbmap", "-display", display_name, "-rules", rules or "evdev"]
    argv += ["-model", model, "-layout", layout, "-variant", variant, "-option", ""]
    for option in filter(None, options.split(",")):
        argv += ["-option", option]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SETXKBMAP_TIMEOUT_S, env={}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KeymapError(
            f"setxkbmap could not restore the layout {baseline.layout}: {exc}"
        ) from None
    if done.returncode != 0:
        raise KeymapError(
            f"setxkbmap could not restore the layout {baseline.layout}: {done.stderr.strip()[-300:]}"
        )
    display.sync()
    after = keyboard_state(display, baseline.keycodes)
    if not after.same_keyboard(baseline):
        raise KeymapError(
            f"the keyboard still differs from the baseline {baseline.layout} after setxkbmap"
        )
    if now.names != baseline.names:
        return f"layout {now.layout} -> {baseline.layout}"
    return f"keymap of {baseline.layout}"
