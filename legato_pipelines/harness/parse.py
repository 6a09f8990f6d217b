"""Model responses -> structured actions, the way OSWorld's Qwen agents read them.

What is read (OSWorld ``mm_agents/qwen3vl_agent.py`` / ``qwen25vl_agent.py``):

- A ``<think>...</think>`` block before the answer is reasoning, not an action.
- The first line starting with ``Action:`` (case-insensitive) is the step's text.
- Every ``<tool_call>...</tool_call>`` block, and every bare one-line JSON
  ``{"name": ..., "arguments": ...}``, is one ``computer_use`` call, in order: several calls
  give several actions. A final ``<tool_call>`` left open is read too (OSWorld does). A block
  ends at the first ``</tool_call>`` after its complete JSON object, so text to type may
  hold the tag itself.
- Model coordinates map to screen pixels with OSWorld's scale factors, relative
  ``x * (W / 999)`` (``qwen3vl``), absolute ``x * (W / processed_W)`` (``qwen25vl``), rounded
  to the nearest pixel (half up; OSWorld's ``int()`` truncates, so a product computed as
  760.9999 would land one pixel off the point the image processor's maths gives: 761). A
  model coordinate outside the image the model saw (outside ``0..999`` for ``qwen3vl``,
  outside ``0..processed_W-1`` x ``0..processed_H-1`` for ``qwen25vl``) is an invalid action,
  not a click at the screen's edge: OSWorld's action space gives every coordinate a valid
  range (``desktop_env/envs/actions.py``: ``x`` in ``[0, X_MAX]``). The response then gets a
  ``parse_error`` naming the coordinate and the range, and no input is sent. Only the grid's
  own edge is held on the screen (``999 * W / 999`` is ``W``, one past the last pixel).

Where this parser is stricter than OSWorld's (which logs and skips what it cannot read),
a response that cannot be fully read yields ``parse_error`` (the reason) and no actions,
so the step does nothing and the fact is on the record: broken JSON, prose only, output cut
by ``max_tokens`` (``finish_reason == "length"``) inside or before a tool call, another
tool's name, an unknown action, a missing or malformed required argument, an unknown key
name, a coordinate outside the model's image. Parsing never raises. Actions after a ``terminate`` are dropped (OSWorld stops the
episode at ``DONE``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..actions import ACTION_NAMES, POINTER_ACTIONS, Action
from .keys import KeyNameError, normalize_keys
from .render import pyautogui_function

TOOL_NAME = "computer_use"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
# Qwen2.5's agent also takes these line starts as the step's text (whole line kept).
_QWEN25_TEXT_STARTS = ("action:", "step", "i will", "i'll", "now i")
_FAIL_STATUSES = frozenset({"failure", "fail", "failed", "infeasible"})
_ACTION_SET = frozenset(ACTION_NAMES)


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """What one model response means.

    Fields:
      actions       structured actions in order (empty when ``parse_error`` is set)
      action_text   the text of the first ``Action:`` line, ``None`` when there is none
      parse_error   why the response could not be read (``None`` when it could)
      terminal      ``"done"`` | ``"fail"`` when the response ends the attempt, else ``None``
      history_text  the text OSWorld keeps for this step's "Step i: ..." line (variant rules:
                    qwen3vl the ``Action:`` text, qwen25vl the whole first matching line;
                    else "Performing <pyautogui function> action", else "")
    """

    actions: list[Action] = field(default_factory=list)
    action_text: str | None = None
    parse_error: str | None = None
    terminal: str | None = None
    history_text: str = ""

    def to_record(self) -> dict[str, Any]:
        """JSON-able form: ``actions`` as :meth:`Action.to_record`, ``None`` fields left out."""
        out: dict[str, Any] = {"actions": [a.to_record() for a in self.actions]}
        if self.action_text is not None:
            out["action_text"] = self.action_text
        if self.parse_error is not None:
            out["parse_error"] = self.parse_error
        if self.terminal is not None:
            out["terminal"] = self.terminal
        return out


class CoordinateOutOfRange(ValueError):
    """A model coordinate outside the image the model saw (an invalid action)."""


@dataclass(frozen=True, slots=True)
class CoordinateMap:
    """Model coordinates -> screen pixels: the one place every backend's targets come from.

    ``screen`` is (W, H) in pixels; ``divisor`` the value a model coordinate is divided by
    (999 for relative coordinates; the processed image size for absolute ones); ``limit``
    the largest valid model coordinate per axis (inclusive; the smallest is 0). ``map``
    returns ``v * (W / divisor)`` rounded to the nearest pixel (half up, never truncated),
    held on ``[0, W-1]`` (only the grid's own edge, ``999 -> W``, needs it), and raises
    :class:`CoordinateOutOfRange` for a model coordinate outside ``[0, limit]``.
    """

    screen: tuple[int, int]
    divisor: tuple[float, float]
    limit: tuple[float, float]

    @classmethod
    def relative(cls, screen: tuple[int, int]) -> CoordinateMap:
        """Qwen3-VL's 0..999 grid (OSWorld: ``x * W / 999``)."""
        return cls(screen, (999, 999), (999, 999))

    @classmethod
    def absolute(cls, screen: tuple[int, int], processed: tuple[int, int]) -> CoordinateMap:
        """Pixels of the resized image the model saw (Qwen2.5-VL), ``processed`` = (w, h)."""
        return cls(screen, processed, (processed[0] - 1, processed[1] - 1))

    def map(self, x: float, y: float) -> tuple[int, int]:
        """Model ``(x, y)`` -> screen ``(x, y)`` [px].

        Raises :class:`CoordinateOutOfRange` (naming the point and the valid range) when the
        point lies outside ``[0, limit]`` on either axis: no screen point stands for it.
        """
        if not (0 <= x <= self.limit[0] and 0 <= y <= self.limit[1]):
            raise CoordinateOutOfRange(
                f"coordinate [{x:g}, {y:g}] is outside the model's image "
                f"(x 0..{self.limit[0]:g}, y 0..{self.limit[1]:g}); no input sent"
            )
        width, height = self.screen
        sx = _nearest(x * (width / self.divisor[0]))
        sy = _nearest(y * (height / self.divisor[1]))
        return min(sx, width - 1), min(sy, height - 1)


def _nearest(value: float) -> int:
    """``value`` [px] rounded to the nearest integer pixel, halves up (760.9999 -> 761)."""
    return math.floor(value + 0.5)


class _Unreadable(Exception):
    """Internal: the reason a response cannot be read."""


def parse_response(
    content: str | None,
    finish_reason: str | None,
    *,
    variant: str,
    coords: CoordinateMap,
    osworld_exact: bool = False,
) -> ParsedResponse:
    """Read one response of the ``variant`` agent (``qwen3vl`` | ``qwen25vl``).

    ``finish_reason`` ``"length"`` marks output cut by ``max_tokens``. ``osworld_exact``
    makes ``terminate`` with ``status: failure`` end the attempt as ``"done"`` (OSWorld maps
    both statuses to DONE); by default it is ``"fail"``. Never raises.
    """
    text = content or ""
    cut = finish_reason == "length"
    answer, reasoning_open = _strip_reasoning(text)
    scan = _Scan()
    try:
        scan.run(answer)
    except Exception as exc:  # defensive: parsing must never raise
        return ParsedResponse(parse_error=f"unreadable response: {exc!r}")
    history = scan.action_line3 if variant == "qwen3vl" else scan.text_line25
    try:
        if not scan.calls:
            raise _Unreadable(_no_call_reason(text, cut, reasoning_open))
        actions = [
            _action(body, closed, cut, index, coords)
            for index, (body, closed) in enumerate(scan.calls, start=1)
        ]
    except _Unreadable as exc:
        return ParsedResponse(
            action_text=scan.action_text, parse_error=str(exc), history_text=history or ""
        )
    except Exception as exc:  # defensive: parsing must never raise
        return ParsedResponse(
            action_text=scan.action_text,
            parse_error=f"unreadable tool call: {exc!r}",
            history_text=history or "",
        )
    terminal = None
    for i, act in enumerate(actions):
        if act.action == "terminate":
            del actions[i + 1 :]
            terminal = "fail" if act.status == "failure" and not osworld_exact else "done"
            break
    if not history:
        history = f"Performing {pyautogui_function(actions[0])} action"
    return ParsedResponse(
        actions=actions, action_text=scan.action_text, terminal=terminal, history_text=history
    )


def _strip_reasoning(text: str) -> tuple[str, bool]:
    """(the answer after the last ``</think>``, whether a ``<think>`` was never closed)."""
    end = text.rfind(_THINK_CLOSE)
    if end >= 0:
        return text[end + len(_THINK_CLOSE) :], False
    start = text.find(_THINK_OPEN)
    if start >= 0:
        return text[:start], True
    return text, False


def _no_call_reason(text: str, cut: bool, reasoning_open: bool) -> str:
    if not text.strip():
        return "empty response" + (" (cut by max_tokens: finish_reason=length)" if cut else "")
    if cut:
        where = "inside the reasoning block" if reasoning_open else "before any tool call"
        return f"output cut by max_tokens (finish_reason=length) {where}"
    if reasoning_open:
        return "reasoning block (<think>) never closed; no tool call"
    return "no tool call in the response (prose only)"


class _Scan:
    """One pass over the answer: ``Action:`` lines, tool-call bodies and bare JSON lines."""

    __slots__ = ("calls", "action_text", "action_line3", "text_line25")

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []  # (JSON body, closed)
        self.action_text: str | None = None
        self.action_line3: str | None = None
        self.text_line25: str | None = None

    def run(self, text: str) -> None:
        pos = 0
        while True:
            start = text.find(_OPEN, pos)
            self._outside(text[pos : start if start >= 0 else len(text)])
            if start < 0:
                return
            body_start = start + len(_OPEN)
            end = text.find(_CLOSE, _json_end(text, body_start))
            if end < 0:
                self.calls.append((text[body_start:], False))
                return
            self.calls.append((text[body_start:end], True))
            pos = end + len(_CLOSE)

    def _outside(self, chunk: str) -> None:
        for raw in chunk.split("\n"):
            line = raw.strip()
            if not line:
                continue
            low = line.lower()
            if low.startswith("action:"):
                if self.action_text is None:
                    self.action_text = line[len("action:") :].strip()
                    # OSWorld's Qwen3-VL agent: line.split("Action:")[-1].strip()
                    self.action_line3 = line.split("Action:")[-1].strip()
            if self.text_line25 is None and low.startswith(_QWEN25_TEXT_STARTS):
                self.text_line25 = line
            if line.startswith("{") and ('"name"' in line or '"arguments"' in line):
                # A bare one-line JSON tool call (or what is left of one).
                self.calls.append((line, line.endswith("}")))


_DECODER = json.JSONDecoder()


def _json_end(text: str, start: int) -> int:
    """Where the JSON object opening at ``text[start:]`` (after whitespace) ends, else ``start``.

    A block ends at the closing tag that follows the complete object, so a string inside it
    may hold ``</tool_call>`` (``{"text": "a </tool_call> b"}``). What does not decode ends at
    the first closing tag, and reads as broken JSON there.
    """
    begin = start
    while begin < len(text) and text[begin].isspace():
        begin += 1
    if not text.startswith("{", begin):
        return start
    try:
        return _DECODER.raw_decode(text, begin)[1]
    except json.JSONDecodeError:
        return start


def _action(body: str, closed: bool, cut: bool, index: int, coords: CoordinateMap) -> Action:
    where = f"tool call {index}"
    if not closed and cut:
        raise _Unreadable(f"output cut by max_tokens (finish_reason=length) inside {where}")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"broken JSON in {where}: {exc.msg} at char {exc.pos}") from None
    if not isinstance(call, dict):
        raise _Unreadable(f"{where} is not a JSON object")
    name = call.get("name")
    if name != TOOL_NAME:
        raise _Unreadable(f"{where} names tool {_short(name)}, expected {TOOL_NAME!r}")
    args = call.get("arguments")
    if isinstance(args, str):  # OpenAI-style arguments given as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            raise _Unreadable(f"broken JSON in {where} arguments: {exc.msg}") from None
    if not isinstance(args, dict):
        raise _Unreadable(f"{where} has no arguments object")
    kind = args.get("action")
    if kind is None:
        raise _Unreadable(f"{where} has no action")
    if not isinstance(kind, str) or kind not in _ACTION_SET:
        raise _Unreadable(f"{where}: unknown action {_short(kind)}")
    return _BUILDERS[kind](kind, args, coords)


def _pointer(kind: str, args: dict[str, Any], coords: CoordinateMap) -> Action:
    point = _coordinate(kind, args, coords, required=kind in ("mouse_move", "left_click_drag"))
    if point is None:
        return Action(kind, args)
    return Action(kind, args, x=point[0], y=point[1])


def _type(kind: str, args: dict[str, Any], coords: CoordinateMap) -> Action:
    text = args.get("text")
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise _Unreadable(
            "type needs a text string" if text is None else "type: text is not a string"
        )
    return Action(kind, args, text=text)


def _key(kind: str, args: dict[str, Any], coords: CoordinateMap) -> Action:
    keys = args.get("keys")
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list) or not keys:
        raise _Unreadable("key needs a non-empty keys list")
    names = []
    for key in keys:
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        if not isinstance(key, str):
            raise _Unreadable(f"key: key name {_short(key)} is not a string")
        names.append(key)
    try:
        return Action(kind, args, keys=normalize_keys(names))
    except KeyNameError as exc:
        raise _Unreadable(f"key: {exc}") from None


def _scroll(kind: str, args: dict[str, Any], coords: CoordinateMap) -> Action:
    pixels = _number(args.get("pixels"))
    if pixels is None:
        raise _Unreadable("scroll needs a number of pixels")
    point = _coordinate(kind, args, coords, required=False)
    if point is None:
        return Action(kind, args, pixels=int(pixels))
    return Action(kind, args, x=point[0], y=point[1], pixels=int(pixels))


def _wait(kind: str, args: dict[str, Any], coords: CoordinateMap) -> Action:
    seconds = _number(args.get("time"))
    return Action(kind, args, seconds=None if seconds is None else max(0.0, float(seconds)))


def _terminate(kind: str, args: dict[str, Any], coords: CoordinateMap) -> Action:
    status = args.get("status")
    failed = isinstance(status, str) and status.strip().lower() in _FAIL_STATUSES
    return Action(kind, args, status="failure" if failed else "success")


_BUILDERS = {
    **dict.fromkeys(POINTER_ACTIONS, _pointer),
    "type": _type,
    "key": _key,
    "scroll": _scroll,
    "wait": _wait,
    "terminate": _terminate,
}


def _number(value: Any) -> float | None:
    """A finite number from a JSON number or numeric string, else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return value
    return None


def _coordinate(
    kind: str, args: dict[str, Any], coords: CoordinateMap, *, required: bool
) -> tuple[int, int] | None:
    """The action's ``coordinate`` as screen pixels (``None`` when absent and optional)."""
    value = args.get("coordinate")
    if value is None:
        if required:
            raise _Unreadable(f"{kind} needs a coordinate [x, y]")
        return None
    if isinstance(value, str):  # "[512, 384]" or "512, 384"
        value = value.strip().strip("[]()").split(",")
    if isinstance(value, list | tuple) and len(value) == 2:
        x, y = _number(value[0]), _number(value[1])
        if x is not None and y is not None:
            try:
                return coords.map(x, y)
            except CoordinateOutOfRange as exc:
                raise _Unreadable(f"invalid action: {kind} {exc}") from None
    raise _Unreadable(f"{kind}: coordinate must be [x, y] numbers, got {_short(value)}")


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: model text in a reason stays small."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
