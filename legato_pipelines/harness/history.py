"""History policies: how many screenshots the next prompt keeps.

OSWorld replays the last 4 turns (``history_n=4``), so every step drops a screenshot and the
prompt's prefix changes at the first user message each step, which empties the server's
prefix cache. Here every screenshot stays in the prompt up to ``image_max`` (default 20) and
the policy decides what happens beyond it. Turns that leave the prompt survive as the
"Step i: <Action line>" text of the first user message, as in OSWorld.

A policy is any object with ``keep(images: int) -> int``: given the number of screenshots
the next request would hold if nothing were dropped (the kept turns plus the current one),
it returns how many to keep (the most recent ones); returning ``images`` drops nothing.
Between drops every request extends the previous one exactly (append-only).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import ConfigError


@runtime_checkable
class HistoryPolicy(Protocol):
    """Decides how many of the most recent screenshots the next request keeps."""

    image_max: int

    def keep(self, images: int) -> int:
        """``images`` -> number kept (``1 <= kept <= images``; ``images`` = no drop)."""
        ...


class WindowPolicy:
    """Sliding window: over ``image_max`` images, drop the oldest (one per step).

    The prefix changes at every step once the window is full.
    """

    def __init__(self, image_max: int = 20):
        self.image_max = _check_image_max(image_max)

    def keep(self, images: int) -> int:
        return min(images, self.image_max)

    def __repr__(self) -> str:
        return f"WindowPolicy(image_max={self.image_max})"


class HysteresisPolicy:
    """High/low water: once images pass ``image_max`` (high), drop to ``low_water`` at once.

    The prompt then grows append-only for ``image_max - low_water`` steps before the next
    drop, so the prefix (and the server's prefix cache) survives most steps.
    ``low_water`` defaults to ``image_max // 2`` (at least 1).
    """

    def __init__(self, image_max: int = 20, low_water: int | None = None):
        self.image_max = _check_image_max(image_max)
        if low_water is None:
            low_water = max(1, image_max // 2)
        if isinstance(low_water, bool) or not isinstance(low_water, int):
            raise ConfigError(f"low_water must be an int, got {low_water!r}")
        if not 1 <= low_water <= image_max:
            raise ConfigError(
                f"low_water={low_water} must be between 1 and image_max={image_max}; "
                "it is the number of screenshots kept after a drop"
            )
        self.low_water = low_water

    def keep(self, images: int) -> int:
        return images if images <= self.image_max else self.low_water

    def __repr__(self) -> str:
        return f"HysteresisPolicy(image_max={self.image_max}, low_water={self.low_water})"


HISTORY_POLICIES = ("window", "hysteresis")


def make_policy(
    history: str | HistoryPolicy, image_max: int, low_water: int | None
) -> HistoryPolicy:
    """The policy named by ``history`` (``"window"`` | ``"hysteresis"``), or ``history``
    itself when it already is a :class:`HistoryPolicy`. Raises ``ConfigError`` on bad input."""
    if isinstance(history, str):
        if history == "window":
            if low_water is not None:
                raise ConfigError(
                    "low_water applies to history='hysteresis' only; drop it or use hysteresis"
                )
            return WindowPolicy(image_max)
        if history == "hysteresis":
            return HysteresisPolicy(image_max, low_water)
        raise ConfigError(f"history={history!r} is unknown: use one of {HISTORY_POLICIES}")
    if isinstance(history, HistoryPolicy):
        if low_water is not None:
            raise ConfigError("low_water is set on the HistoryPolicy object itself, not beside it")
        return history
    raise ConfigError(
        f"history must be one of {HISTORY_POLICIES} or a HistoryPolicy, got {history!r}"
    )


def _check_image_max(image_max: int) -> int:
    if isinstance(image_max, bool) or not isinstance(image_max, int) or image_max < 1:
        raise ConfigError(
            f"image_max must be an int >= 1 (screenshots kept in the prompt), got {image_max!r}"
        )
    return image_max
