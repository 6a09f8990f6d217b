"""Screenshot sizing the way the Qwen VL processors expect it (``smart_resize``).

Rule (Qwen's ``qwen_vl_utils.smart_resize``, as vendored by OSWorld ``mm_agents/utils``):
both sides become multiples of ``factor``, the pixel count stays within
``[min_pixels, max_pixels]`` and the aspect ratio is kept as well as rounding allows.
The OSWorld Qwen agents call it with:

- ``qwen3vl``: ``factor=32``, ``max_pixels=13_107_200`` (1920x1080 -> 1920x1088);
- ``qwen25vl``: ``factor=28``, ``max_pixels=1_003_520`` (1920x1080 -> 1316x728).

OSWorld resizes with Pillow's default filter (bicubic) and re-encodes the PNG; here the PNG
is written with ``compress_level=1`` (same pixels, faster), and a screenshot that already has
the target size is returned untouched, without decoding it. Desktops that can resize hand out
the model-size screenshot themselves (``Desktop.observe(size=)``, docs/architecture.md §4)
through the same :func:`~legato_pipelines.images.resized_png`.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import ConfigError
from ..images import Screenshot, resized_png

MAX_ASPECT_RATIO = 200
"""``smart_resize`` refuses images whose long side exceeds 200x the short side (Qwen)."""


@dataclass(frozen=True, slots=True)
class ResizeRule:
    """One variant's ``smart_resize`` parameters (pixels)."""

    factor: int
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280
    max_long_side: int = 8192

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) this rule resizes a ``width`` x ``height`` image to."""
        h, w = smart_resize(
            height,
            width,
            factor=self.factor,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            max_long_side=self.max_long_side,
        )
        return w, h


QWEN3VL_RESIZE = ResizeRule(factor=32, max_pixels=16 * 16 * 4 * 12800)
QWEN25VL_RESIZE = ResizeRule(factor=28, max_pixels=14 * 14 * 4 * 1280)


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 14 * 14 * 4 * 1280,
    max_long_side: int = 8192,
) -> tuple[int, int]:
    """Qwen's ``smart_resize``: returns ``(height, width)`` in pixels (note the order).

    1. A side longer than ``max_long_side`` first scales the image down (truncating).
    2. Each side is rounded to the nearest multiple of ``factor`` (Python ``round``).
    3. Over ``max_pixels``: both sides scale by ``sqrt(h*w / max_pixels)`` and floor to
       multiples of ``factor``; under ``min_pixels``: scale up and ceil.

    Raises ``ConfigError`` for sides under 2 pixels or an aspect ratio above 200.
    """
    if height < 2 or width < 2:
        raise ConfigError(
            f"screenshot size {width}x{height} is too small: both sides must be >= 2 pixels"
        )
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ConfigError(
            f"screenshot size {width}x{height}: aspect ratio above {MAX_ASPECT_RATIO} "
            "is not supported by Qwen's smart_resize"
        )
    if max(height, width) > max_long_side:
        beta = max(height, width) / max_long_side
        height, width = int(height / beta), int(width / beta)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


_CACHE_SIZE = 256
_cache: OrderedDict[tuple[str, int, int], Screenshot] = OrderedDict()
_cache_lock = threading.Lock()


def resize_screenshot(shot: Screenshot, rule: ResizeRule) -> Screenshot:
    """``shot`` resized to ``rule.size(shot.size)``; the same object when no resize is needed.

    Resampling is Pillow's default for ``Image.resize`` (bicubic for RGB/RGBA), which is
    what OSWorld uses; the PNG is re-encoded with ``compress_level=1``. Decode + resize +
    encode cost ~40-80 ms of CPU at 720p-1080p, so results are kept in a small LRU keyed by
    the source's content hash: a screen that did not change (or a repeated frame) is resized
    once. Thread-safe (the engine calls it off the event loop).
    """
    width, height = rule.size(shot.width, shot.height)
    if (width, height) == (shot.width, shot.height):
        return shot
    key = (shot.sha, width, height)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    # Pillow's default filter (bicubic; nearest for modes "1"/"P"), as OSWorld; the same
    # function as the desktops that hand out model-size screenshots (images.resized_png).
    resized = Screenshot(resized_png(shot.to_pil(), (width, height)), width, height)
    with _cache_lock:
        _cache[key] = resized
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return resized


def cached_resize(shot: Screenshot, rule: ResizeRule) -> Screenshot | None:
    """The already-resized ``shot`` when :func:`resize_screenshot` has it cached, else ``None``
    (cheap: no pixel work, so the engine can skip a thread hop for repeated screens)."""
    width, height = rule.size(shot.width, shot.height)
    with _cache_lock:
        hit = _cache.get((shot.sha, width, height))
        if hit is not None:
            _cache.move_to_end((shot.sha, width, height))
        return hit


def needs_resize(shot: Screenshot, rule: ResizeRule) -> bool:
    """Whether :func:`resize_screenshot` would change ``shot``'s size (pixels)."""
    return rule.size(shot.width, shot.height) != (shot.width, shot.height)
