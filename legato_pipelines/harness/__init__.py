"""OSWorld's Qwen computer-use harness: prompt, history policy, response parsing, rendering.

Public API::

    from legato_pipelines.harness import Harness, Episode, ParsedResponse, render_pyautogui

    h = Harness(variant="qwen3vl", history="window", image_max=20)
    ep = h.episode(instruction, screen_size=(1920, 1080))
    shot = ep.prepare(screenshot); messages = ep.request(shot)
    parsed = ep.parse(content, finish_reason); ep.record(content, parsed)

Modules: ``prompt`` (OSWorld's prompt text and message dicts), ``history`` (window and
hysteresis policies), ``parse`` (responses -> :class:`~legato_pipelines.actions.Action`),
``keys`` (key-name normalization), ``resize`` (Qwen ``smart_resize``), ``render``
(pyautogui code for OSWorld's ``/execute``), ``episode`` (the per-attempt state).
"""

from .episode import Episode, Harness
from .history import HistoryPolicy, HysteresisPolicy, WindowPolicy
from .parse import CoordinateMap, CoordinateOutOfRange, ParsedResponse, parse_response
from .render import render_osworld_code, render_pyautogui
from .resize import smart_resize

__all__ = [
    "CoordinateMap",
    "CoordinateOutOfRange",
    "Episode",
    "Harness",
    "HistoryPolicy",
    "HysteresisPolicy",
    "ParsedResponse",
    "WindowPolicy",
    "parse_response",
    "render_osworld_code",
    "render_pyautogui",
    "smart_resize",
]
