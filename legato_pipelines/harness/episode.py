"""The harness an engine drives: one :class:`Harness` per batch, one :class:`Episode` per attempt.

Per policy step::

    shot = ep.prepare(screenshot)          # resized as the variant expects
    messages = ep.request(shot)            # system + turns, image parts as legato-image refs
    ...policy call with messages, images from ep.images...
    parsed = ep.parse(content, finish_reason)
    ep.record(content, parsed)             # the assistant turn, replayed raw next step

Message layout (OSWorld's Qwen agents): the system message; the first kept turn's user
message holds its screenshot and the user text (instruction + "Step i: ..." lines of the
turns no longer in the prompt); every later turn is a screenshot-only user message and the
assistant's raw response; the current screenshot comes last. Between history drops each
request's list starts with the previous request's message dicts (the same objects) and only
appends, so the server's prefix cache and the run directory's per-message hashing both hold.
The cost per step is O(1) apart from a shallow copy of the message list (no re-serialization).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..actions import Action
from ..errors import ConfigError
from ..images import Screenshot
from .history import HistoryPolicy, make_policy
from .parse import CoordinateMap, ParsedResponse, parse_response
from .prompt import (
    VARIANTS,
    assistant_message,
    image_part,
    system_message,
    system_prompt,
    user_message,
    user_text,
)
from .render import render_pyautogui
from .resize import (
    QWEN3VL_RESIZE,
    QWEN25VL_RESIZE,
    ResizeRule,
    cached_resize,
    needs_resize,
    resize_screenshot,
)

_RESIZE = {"qwen3vl": QWEN3VL_RESIZE, "qwen25vl": QWEN25VL_RESIZE}


class Harness:
    """OSWorld's Qwen computer-use harness, configured once per batch.

    Args:
      variant       ``"qwen3vl"`` (default: relative 0..999 coordinates, images resized to
                    multiples of 32) or ``"qwen25vl"`` (absolute coordinates on the resized
                    image, multiples of 28, at most 1,003,520 pixels)
      history       ``"window"`` | ``"hysteresis"`` or any :class:`HistoryPolicy`
      image_max     screenshots kept in a prompt (the high-water mark for hysteresis)
      low_water     hysteresis only: screenshots kept after a drop (default ``image_max // 2``)
      osworld_exact ``terminate`` with ``status: failure`` ends the attempt as ``"done"``
                    and renders ``"DONE"``, as OSWorld does (default: ``"fail"``/``"FAIL"``),
                    and ``scroll`` renders without its position

    Raises ``ConfigError`` naming the argument for bad values.
    """

    def __init__(
        self,
        variant: str = "qwen3vl",
        history: str | HistoryPolicy = "window",
        image_max: int = 20,
        low_water: int | None = None,
        osworld_exact: bool = False,
    ):
        if variant not in VARIANTS:
            raise ConfigError(f"variant={variant!r} is unknown: use one of {VARIANTS}")
        if not isinstance(osworld_exact, bool):
            raise ConfigError(f"osworld_exact must be True or False, got {osworld_exact!r}")
        self.variant = variant
        self.policy: HistoryPolicy = make_policy(history, image_max, low_water)
        self.image_max = self.policy.image_max
        self.osworld_exact = osworld_exact
        self.resize_rule: ResizeRule = _RESIZE[variant]
        # One system message per harness: every episode's requests start with this object.
        self.system_message: dict[str, Any] = system_message(system_prompt(variant))

    def episode(self, instruction: str, screen_size: tuple[int, int]) -> Episode:
        """A fresh episode (one attempt) for ``instruction`` on a ``(width, height)`` screen."""
        return Episode(self, instruction, screen_size)

    def render(self, action: Action) -> str:
        """:func:`render_pyautogui` with this harness's ``osworld_exact``."""
        return render_pyautogui(action, osworld_exact=self.osworld_exact)

    def __repr__(self) -> str:
        return (
            f"Harness(variant={self.variant!r}, policy={self.policy!r}, "
            f"osworld_exact={self.osworld_exact})"
        )


@dataclass(slots=True)
class _Turn:
    """One step in the history: its screenshot, the user message as first appended, the
    assistant message, and the step's "Step i:" text."""

    shot: Screenshot
    image: dict[str, Any]
    user: dict[str, Any]
    assistant: dict[str, Any] | None = None
    history_text: str = ""


class Episode:
    """The prompt state of one attempt. Not thread-safe; one per attempt."""

    def __init__(self, harness: Harness, instruction: str, screen_size: tuple[int, int]):
        if not isinstance(instruction, str):
            raise ConfigError(f"instruction must be a str, got {type(instruction).__name__}")
        try:
            width, height = screen_size
        except (TypeError, ValueError):
            raise ConfigError(
                f"screen_size must be (width, height) in pixels, got {screen_size!r}"
            ) from None
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (width, height)):
            raise ConfigError(
                f"screen_size must be two positive ints (pixels), got {screen_size!r}"
            )
        self.harness = harness
        self.instruction = instruction
        self.screen_size = (width, height)
        self._variant = harness.variant
        self._policy = harness.policy
        self._system = harness.system_message
        self._turns: list[_Turn] = []
        self._start = 0  # index of the first turn still replayed in the prompt
        self._messages: list[dict[str, Any]] = [self._system]
        self._images: dict[str, Screenshot] = {}
        self._pending: _Turn | None = None  # requested, not yet recorded
        self.drops = 0  # how many times the history policy dropped screenshots
        # (width, height) the variant sends a screenshot of the screen at (smart_resize)
        self.model_size: tuple[int, int] = harness.resize_rule.size(width, height)
        self._coords = self._coordinate_map(self.model_size)

    # -- images -------------------------------------------------------------------------

    def prepare(self, screenshot: Screenshot) -> Screenshot:
        """``screenshot`` resized the way the variant expects (Qwen ``smart_resize``).

        Returns the same object when the size already fits (no decode). Re-encodes as PNG
        with ``compress_level=1`` otherwise. Raises ``ConfigError`` for degenerate sizes.
        """
        return resize_screenshot(screenshot, self.harness.resize_rule)

    def prepared(self, screenshot: Screenshot) -> Screenshot | None:
        """:meth:`prepare`'s answer when it costs no pixel work (already :attr:`model_size`,
        e.g. a desktop resized it; no resize needed; or the resize is cached), else ``None``:
        the engine then runs :meth:`prepare` off the loop."""
        if screenshot.size == self.model_size:
            return screenshot
        if not needs_resize(screenshot, self.harness.resize_rule):
            return screenshot
        return cached_resize(screenshot, self.harness.resize_rule)

    def needs_resize(self, screenshot: Screenshot) -> bool:
        """Whether :meth:`prepare` has pixel work to do (the engine then runs it off the loop)."""
        return needs_resize(screenshot, self.harness.resize_rule)

    @property
    def images(self) -> dict[str, Screenshot]:
        """sha -> Screenshot for every image the last request refers to."""
        return dict(self._images)

    # -- request ------------------------------------------------------------------------

    def request(self, shot: Screenshot) -> list[dict[str, Any]]:
        """The full message list for this step, with ``shot`` as the current screenshot.

        ``shot`` should come from :meth:`prepare`; with ``qwen25vl`` its size is the
        coordinate space the model answers in. Calling it again before :meth:`record`
        replaces the current screenshot (the same list back when it is the same image).
        """
        if self._pending is not None:
            if self._pending.shot is shot or self._pending.shot.sha == shot.sha:
                return list(self._messages)
            self._messages.pop()
            self._pending = None
            self._images = {t.shot.sha: t.shot for t in self._turns[self._start :]}
        images = len(self._turns) - self._start + 1
        keep = self._policy.keep(images)
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= images:
            raise ConfigError(
                f"history policy {self._policy!r} returned keep={keep!r} for {images} images; "
                f"it must be an int between 1 and {images}"
            )
        if keep < images:
            self._start = len(self._turns) + 1 - keep
            self.drops += 1
            self._rebuild()
        image = image_part(shot)
        if self._start == len(self._turns):
            message = user_message(image, self._user_text())
        else:
            message = user_message(image)
        self._messages.append(message)
        self._images[shot.sha] = shot
        self._pending = _Turn(shot, image, message)
        if self._variant == "qwen25vl":
            self._coords = self._coordinate_map(shot.size)
        return list(self._messages)

    def _user_text(self) -> str:
        return user_text(self.instruction, [t.history_text for t in self._turns[: self._start]])

    def _rebuild(self) -> None:
        """Messages and images of the kept turns (after a drop); new dict for the first."""
        messages: list[dict[str, Any]] = [self._system]
        images: dict[str, Screenshot] = {}
        for j, turn in enumerate(self._turns[self._start :]):
            messages.append(user_message(turn.image, self._user_text()) if j == 0 else turn.user)
            messages.append(turn.assistant)
            images[turn.shot.sha] = turn.shot
        self._messages = messages
        self._images = images

    # -- response -----------------------------------------------------------------------

    def parse(self, content: str | None, finish_reason: str | None) -> ParsedResponse:
        """The structured actions of a response to the last request. Never raises.

        Coordinates map to screen pixels of ``screen_size``; see :mod:`.parse`.
        """
        return parse_response(
            content,
            finish_reason,
            variant=self._variant,
            coords=self._coords,
            osworld_exact=self.harness.osworld_exact,
        )

    def record(self, content: str | None, parsed: ParsedResponse | None) -> None:
        """Append the assistant turn (the raw ``content``, ``""`` for ``None``) to the history.

        ``parsed`` gives the step's "Step i:" text for when the turn leaves the prompt.
        Raises ``RuntimeError`` without a pending :meth:`request`.
        """
        turn = self._pending
        if turn is None:
            raise RuntimeError("Episode.record() needs a request() first (one record per step)")
        turn.assistant = assistant_message(content if content is not None else "")
        turn.history_text = parsed.history_text if parsed is not None else ""
        self._turns.append(turn)
        self._messages.append(turn.assistant)
        self._pending = None

    @property
    def steps(self) -> int:
        """Recorded steps so far."""
        return len(self._turns)

    def _coordinate_map(self, processed: tuple[int, int]) -> CoordinateMap:
        if self._variant == "qwen3vl":
            return CoordinateMap.relative(self.screen_size)
        return CoordinateMap.absolute(self.screen_size, processed)
