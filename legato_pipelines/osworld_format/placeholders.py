"""The placeholders OSWorld substitutes into setup commands before running them.

OSWorld's ``SetupController`` replaces ``{CLIENT_PASSWORD}``, ``{SCREEN_WIDTH}``,
``{SCREEN_HEIGHT}``, ``{SCREEN_WIDTH_HALF}`` and ``{SCREEN_HEIGHT_HALF}`` in commands (5 chrome /
multi_apps tasks use the password for ``sudo -S``; 2 vlc tasks click the screen centre). Only
these exact tokens are replaced, so Python snippets with ``{}`` or ``{x}`` stay intact.
"""

from __future__ import annotations

from typing import Any

PLACEHOLDERS = (
    "{CLIENT_PASSWORD}",
    "{SCREEN_WIDTH}",
    "{SCREEN_HEIGHT}",
    "{SCREEN_WIDTH_HALF}",
    "{SCREEN_HEIGHT_HALF}",
)


def placeholder_values(client_password: str, screen_size: tuple[int, int]) -> dict[str, str]:
    """The replacement text of each placeholder.

    ``screen_size`` is (width, height) in pixels; the halves are integer halves (``w // 2``),
    as OSWorld computes them. ``client_password`` is the desktop user's sudo password
    (OSWorld: ``"password"``, ``"osworld-public-evaluation"`` on AWS).
    """
    width, height = (int(v) for v in screen_size)
    return {
        "{CLIENT_PASSWORD}": client_password,
        "{SCREEN_WIDTH}": str(width),
        "{SCREEN_HEIGHT}": str(height),
        "{SCREEN_WIDTH_HALF}": str(width // 2),
        "{SCREEN_HEIGHT_HALF}": str(height // 2),
    }


def substitute(value: Any, values: dict[str, str]) -> Any:
    """Replace the placeholders in a string, or in every string of a (nested) list.

    Other types (numbers, bools, None, dicts) are returned unchanged. Returns a new object;
    the task config is never modified in place.
    """
    if isinstance(value, str):
        for token, text in values.items():
            if token in value:
                value = value.replace(token, text)
        return value
    if isinstance(value, list):
        return [substitute(item, values) for item in value]
    return value


def placeholders_in(value: Any) -> list[str]:
    """The placeholder tokens a string or (nested) list mentions, in ``PLACEHOLDERS`` order."""
    found: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, str):
            found.update(t for t in PLACEHOLDERS if t in v)
        elif isinstance(v, list):
            for item in v:
                walk(item)

    walk(value)
    return [t for t in PLACEHOLDERS if t in found]
