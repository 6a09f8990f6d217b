"""Structured actions: what the harness parses from a model response and backends execute.

Model text is never executed. Each backend renders an :class:`Action` its own way: XTest
input events for the ``local`` backend, escaped pyautogui code for OSWorld's ``/execute``.

The action names are those of the Qwen ``computer_use`` tool (OSWorld ``mm_agents``):
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ACTION_NAMES: tuple[str, ...] = (
    "left_click",
    "right_click",
    "middle_click",
    "double_click",
    "mouse_move",
    "left_click_drag",
    "type",
    "key",
    "scroll",
    "wait",
    "terminate",
)
POINTER_ACTIONS = frozenset(
    {"left_click", "right_click", "middle_click", "double_click", "mouse_move", "left_click_drag"}
)


@dataclass(frozen=True, slots=True)
class Action:
    """One structured action.

    Fields:
      action      the tool call's action name (one of :data:`ACTION_NAMES`)
      arguments   the tool call's arguments exactly as the model gave them (model coordinates)
      x, y        the target in screen pixels (clicks, move, drag end point, scroll position);
                  ``None`` when the action has no coordinate
      text        ``type``: the text to type verbatim (a newline presses Return)
      keys        ``key``: normalized key names, pressed together as a chord, in order
      pixels      ``scroll``: scroll amount (positive up, negative down, as Qwen/pyautogui)
      seconds     ``wait``: how long to wait, in seconds
      status      ``terminate``: ``"success"`` or ``"failure"``

    A model coordinate outside the model's image never becomes an action (the harness
    records a ``parse_error`` instead: ``harness/parse.py``), so ``x, y`` is always on the
    screen. Older records may carry ``"clamped": true`` from when such points were clamped.
    """

    action: str
    arguments: dict[str, Any] = field(default_factory=dict)
    x: int | None = None
    y: int | None = None
    text: str | None = None
    keys: tuple[str, ...] = ()
    pixels: int | None = None
    seconds: float | None = None
    status: str | None = None

    def to_record(self) -> dict[str, Any]:
        """The JSON-able form kept in a step's ``actions[]`` (no ``None`` fields)."""
        out: dict[str, Any] = {"action": self.action, "arguments": self.arguments}
        if self.x is not None:
            out["screen"] = [self.x, self.y]
        if self.text is not None:
            out["text"] = self.text
        if self.keys:
            out["keys"] = list(self.keys)
        if self.pixels is not None:
            out["pixels"] = self.pixels
        if self.seconds is not None:
            out["seconds"] = self.seconds
        if self.status is not None:
            out["status"] = self.status
        return out
