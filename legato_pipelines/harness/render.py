"""Structured actions rendered as pyautogui code for OSWorld's ``/execute`` endpoint.

The code is built from literals only: numbers are ints formatted by ``repr`` and every string
(typed text, key names) goes through ``repr``, never through string concatenation, so a
``type`` of ``'); import os; os.system('...`` types those characters and runs nothing.

Mapping (OSWorld ``mm_agents/qwen3vl_agent.py``, newer repository for ``type``):

==================  ==========================================================
left_click          ``pyautogui.click(x, y)`` (``click()`` without a coordinate)
right_click         ``pyautogui.rightClick(x, y)``
middle_click        ``pyautogui.middleClick(x, y)``
double_click        ``pyautogui.doubleClick(x, y)``
mouse_move          ``pyautogui.moveTo(x, y)``
left_click_drag     ``pyautogui.dragTo(x, y, duration=0.5)``
type                per line ``pyautogui.typewrite(<line>, interval=0.03)``, with
                    ``pyautogui.press('enter')`` between lines
key                 ``pyautogui.press(k)`` for one key, ``pyautogui.hotkey(k1, k2, ...)``
scroll              ``pyautogui.scroll(pixels, x=x, y=y)``; OSWorld ignores the position:
                    ``osworld_exact=True`` gives ``pyautogui.scroll(pixels)``
wait                ``"WAIT"``
terminate           ``"DONE"``; ``"FAIL"`` for ``status: failure`` unless ``osworld_exact``
==================  ==========================================================

Multi-statement code (``type`` with newlines) is joined with newlines: OSWorld runs it with
``python -c`` after its ``import pyautogui; ...`` prefix. :func:`render_osworld_code` is what
the desktops that run actions as OSWorld's ``DesktopEnv.step`` does send (with its ``<`` fix).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..actions import Action

DRAG_DURATION_S = 0.5
"""Seconds of a ``left_click_drag`` (OSWorld's default)."""
TYPE_INTERVAL_S = 0.03
"""Seconds between typed characters (OSWorld's newer ``type`` rendering)."""

_CLICKS = {
    "left_click": "click",
    "right_click": "rightClick",
    "middle_click": "middleClick",
    "double_click": "doubleClick",
    "mouse_move": "moveTo",
}


def pyautogui_function(action: Action) -> str:
    """The pyautogui function name an action renders to first (``"wait"``/``"terminate"``
    for the two special actions). OSWorld's fallback history text
    ("Performing <function> action") uses it."""
    if action.action in _CLICKS:
        return _CLICKS[action.action]
    return {
        "left_click_drag": "dragTo",
        "type": "typewrite",
        "key": "press" if len(action.keys) <= 1 else "hotkey",
        "scroll": "scroll",
    }.get(action.action, action.action)


def render_pyautogui(action: Action, *, osworld_exact: bool = False) -> str:
    """pyautogui code (or ``"WAIT"``/``"DONE"``/``"FAIL"``) for one structured action.

    ``osworld_exact``: render exactly what OSWorld's Qwen agents emit (``terminate`` is
    always ``"DONE"``; ``scroll`` ignores its coordinate).
    Raises ``ValueError`` for an action name outside :data:`~legato_pipelines.actions.ACTION_NAMES`
    or an action missing the field its rendering needs.
    """
    name = action.action
    if name in _CLICKS:
        if action.x is None:
            if name == "mouse_move":
                raise ValueError("mouse_move needs x and y")
            return f"pyautogui.{_CLICKS[name]}()"
        return f"pyautogui.{_CLICKS[name]}({_int(action.x)!r}, {_int(action.y)!r})"
    if name == "left_click_drag":
        if action.x is None:
            raise ValueError("left_click_drag needs x and y")
        return (
            f"pyautogui.dragTo({_int(action.x)!r}, {_int(action.y)!r}, "
            f"duration={DRAG_DURATION_S!r})"
        )
    if name == "type":
        if action.text is None:
            raise ValueError("type needs text")
        return _render_type(action.text)
    if name == "key":
        if not action.keys:
            raise ValueError("key needs at least one key name")
        keys = ", ".join(repr(str(k)) for k in action.keys)
        return f"pyautogui.{'press' if len(action.keys) == 1 else 'hotkey'}({keys})"
    if name == "scroll":
        if action.pixels is None:
            raise ValueError("scroll needs pixels")
        pixels = _int(action.pixels)
        if action.x is None or osworld_exact:
            return f"pyautogui.scroll({pixels!r})"
        return f"pyautogui.scroll({pixels!r}, x={_int(action.x)!r}, y={_int(action.y)!r})"
    if name == "wait":
        return "WAIT"
    if name == "terminate":
        return "FAIL" if action.status == "failure" and not osworld_exact else "DONE"
    raise ValueError(f"unknown action {name!r}")


def _render_type(text: str) -> str:
    # Newer OSWorld: one typewrite per line, Enter pressed between lines. "\r\n" counts as
    # one line break (typewrite would press Return for the "\r" as well).
    lines = text.replace("\r\n", "\n").split("\n")
    code: list[str] = []
    for i, line in enumerate(lines):
        if line:
            code.append(f"pyautogui.typewrite({line!r}, interval={TYPE_INTERVAL_S!r})")
        if i < len(lines) - 1:
            code.append("pyautogui.press('enter')")
    # Typing "" does nothing; "pass" keeps the command valid Python.
    return "\n".join(code) if code else "pass"


def _int(value: object) -> int:
    # Only real ints reach the code; anything else (a str smuggled into a coordinate) fails.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an int coordinate or amount, got {value!r}")
    return int(value)


#: How OSWorld types ``<`` (its ``_fix_pyautogui_less_than_bug``): pyautogui's X11 backend
#: types ``>`` for ``<`` (pyautogui issue 198).
LESS_THAN = 'pyautogui.hotkey("shift", ",")'


#: Characters pyautogui's X11 backend types (its key table): printable ASCII and tab. It
#: silently skips every other one (``Spaß`` arrives as ``Spa``).
PYAUTOGUI_CHARS = frozenset(chr(c) for c in range(0x20, 0x7F)) | {"\t"}
#: The source of :mod:`.vm_typer`, run inside the desktop's python for the other characters.
VM_TYPER_SOURCE = Path(__file__).with_name("vm_typer.py").read_text(encoding="utf-8")


def render_osworld_code(action: Action) -> str:
    """pyautogui code for ``action``: :func:`render_pyautogui`, with OSWorld's ``<`` fix, and
    text pyautogui cannot type typed through XTest.

    ``DesktopEnv.step`` rewrites ``<`` only inside ``typewrite('...')`` without arguments;
    the harness renders ``typewrite('...', interval=0.03)`` (newer OSWorld Qwen agents), which
    the rewrite misses, so ``<`` would arrive as ``>``. The same fix is applied here on the
    structured action: the text is split at ``<`` and each ``<`` typed as shift+comma.

    A ``type`` whose text holds characters outside :data:`PYAUTOGUI_CHARS` (``ß``, ``€``,
    Cyrillic, CJK) keeps ``typewrite`` for its ASCII runs and types the rest with
    :class:`~legato_pipelines.harness.vm_typer.LegatoTyper` (its source is part of the code:
    ``exec`` of a literal, the text only ever a ``repr`` argument). What it could not type is
    printed as ``LEGATO_NOT_TYPED <json>`` (:func:`not_typed_in`).
    """
    if action.action == "type" and action.text and _needs_typer(action.text):
        return _render_type_with_typer(action)
    if action.action == "type" and action.text and "<" in action.text:
        parts = action.text.split("<")
        code = []
        for i, part in enumerate(parts):
            if part:
                code.append(render_pyautogui(replace(action, text=part)))
            if i < len(parts) - 1:
                code.append(LESS_THAN)
        return "\n".join(code)
    return render_pyautogui(action)


def _needs_typer(text: str) -> bool:
    return any(c not in PYAUTOGUI_CHARS and c not in "\r\n" for c in text)


def _render_type_with_typer(action: Action) -> str:
    """``type`` code: ASCII runs as :func:`render_osworld_code` renders them, the other
    characters through ``LegatoTyper`` (mapped up front), Return between lines."""
    text = action.text.replace("\r\n", "\n")
    others = "".join(dict.fromkeys(c for c in text if c not in PYAUTOGUI_CHARS and c != "\n"))
    code = [f"exec({VM_TYPER_SOURCE!r})", f"_legato_typer = LegatoTyper({others!r})"]
    lines = text.split("\n")
    for i, line in enumerate(lines):
        start = 0
        while start < len(line):
            ascii_run = line[start] in PYAUTOGUI_CHARS
            end = start
            while end < len(line) and (line[end] in PYAUTOGUI_CHARS) == ascii_run:
                end += 1
            run = line[start:end]
            if ascii_run:
                code.append(render_osworld_code(replace(action, text=run)))
            else:
                code.append(f"_legato_typer.type({run!r}, {TYPE_INTERVAL_S!r})")
            start = end
        if i < len(lines) - 1:
            code.append("pyautogui.press('enter')")
    code.append("_legato_typer.close()")
    return "\n".join(code)


def not_typed_in(output: str | None) -> str | None:
    """The characters a ``type`` action's code reported it could not type (its stdout's
    ``LEGATO_NOT_TYPED <json string>`` lines, joined), or ``None`` when it typed everything
    (or printed nothing: plain pyautogui code)."""
    from .vm_typer import NOT_TYPED_MARK

    missed = []
    for line in (output or "").splitlines():
        if line.startswith(NOT_TYPED_MARK):
            try:
                missed.append(str(json.loads(line[len(NOT_TYPED_MARK) :])))
            except ValueError:
                missed.append(line[len(NOT_TYPED_MARK) :])
    return "".join(missed) or None
