"""Actions drawn over a screenshot: click points, drags, scrolls, typed text and keys.

Marks are in *screen* pixels (the action's mapped coordinates, ``screen`` in the record), drawn
in an SVG whose ``viewBox`` is the screen size laid exactly over the screenshot (the stored
screenshot is the screen resized for the model, same aspect up to rounding), so a mark lands
where the desktop received the event whatever size the page shows the image at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..harness.resize import QWEN3VL_RESIZE, QWEN25VL_RESIZE

COMMON_SCREENS: tuple[tuple[int, int], ...] = (
    (1280, 720),
    (1920, 1080),
    (1280, 800),
    (1366, 768),
    (1440, 900),
    (1600, 900),
    (1024, 768),
    (1280, 1024),
    (1680, 1050),
    (1920, 1200),
    (2560, 1440),
    (3840, 2160),
)
"""Screen sizes tried when inferring the screen from a stored screenshot's size."""

CLICKS = {"left_click", "right_click", "middle_click", "double_click", "triple_click", "click"}


def screen_size(image_size: tuple[int, int], harness: str | None = None) -> tuple[int, int]:
    """The desktop's screen size behind a stored screenshot of ``image_size``: the common
    screen size the harness's resize rule (``qwen3vl``/``qwen25vl``) turns into exactly that
    size, else the image size itself (a screenshot stored unresized)."""
    rules = [QWEN25VL_RESIZE, QWEN3VL_RESIZE] if harness == "qwen25vl" else [QWEN3VL_RESIZE]
    if tuple(image_size) in COMMON_SCREENS:
        return tuple(image_size)
    for rule in rules:
        for screen in COMMON_SCREENS:
            if rule.size(*screen) == tuple(image_size):
                return screen
    return tuple(image_size)


@dataclass(slots=True)
class Mark:
    """One drawn action: ``kind`` (``click``, ``drag``, ``scroll``, ``move``, ``label``), the
    screen point (``x``, ``y``; ``None`` for a label without a point), a drag's start
    (``x0``, ``y0``), and the ``label`` text (button, typed text, keys, scroll amount)."""

    kind: str
    index: int
    label: str
    x: float | None = None
    y: float | None = None
    x0: float | None = None
    y0: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _point(value: Any) -> tuple[float, float] | None:
    if isinstance(value, list | tuple) and len(value) == 2:
        try:
            return float(value[0]), float(value[1])
        except (TypeError, ValueError):
            return None
    return None


def short(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters (newlines shown as ⏎)."""
    text = text.replace("\n", "⏎").replace("\t", "⇥")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def marks_for(actions: list[Any]) -> list[Mark]:
    """The marks of one step's executed actions (typed ``ActionRecord`` or JSON dicts).

    A drag's start point is the screen point of the ``mouse_move``/``left_click_drag`` before
    it when the record has one, else only its end point is drawn."""
    out: list[Mark] = []
    last_point: tuple[float, float] | None = None
    for i, a in enumerate(actions):
        rec = a if isinstance(a, dict) else a.to_json_dict()
        name = rec.get("action") or "?"
        point = _point(rec.get("screen"))
        if name in CLICKS and point:
            label = name.replace("_click", "").replace("left", "click").replace("_", " ")
            if rec.get("clamped"):
                label += " (clamped)"
            out.append(Mark("click", i, label, *point))
        elif name in ("left_click_drag", "drag") and point:
            x0, y0 = last_point if last_point else (None, None)
            out.append(Mark("drag", i, "drag", point[0], point[1], x0, y0))
        elif name == "scroll":
            pixels = rec.get("pixels")
            label = f"scroll {'up' if (pixels or 0) > 0 else 'down'} {abs(pixels or 0)}"
            x, y = point if point else (None, None)
            out.append(Mark("scroll", i, label, x, y, extra={"up": (pixels or 0) > 0}))
        elif name == "mouse_move" and point:
            out.append(Mark("move", i, "move", *point))
        elif name == "type":
            out.append(Mark("label", i, "type: " + short(rec.get("text") or "")))
        elif name == "key":
            out.append(Mark("label", i, "key: " + "+".join(rec.get("keys") or [])))
        elif name == "wait":
            out.append(Mark("label", i, f"wait {rec.get('seconds') or ''} s"))
        elif name == "terminate":
            out.append(Mark("label", i, f"terminate: {rec.get('status') or ''}"))
        else:
            out.append(Mark("label", i, name))
        if point:
            last_point = point
    return out
