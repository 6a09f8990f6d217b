"""The ``fake`` backend: no VMs, real PNG screens, seeded rewards, configurable latency and faults.

It stands in for real desktops in tests and benchmarks and lets a team wire its trainer
before any desktop exists (the mock transport of the desktop protocol).

Options (``DesktopConfig.options``):
  latency   per phase, seconds: ``{"reset": 2.0, "act": {"dist": "lognormal", "median": 0.1,
            "sigma": 0.5}, "observe": 0, "evaluate": 1.0}``; a number is fixed, a mapping is
            sampled (``lognormal`` median/sigma, ``uniform`` low/high, ``exponential`` mean)
  faults    per-call probabilities: ``reset_failure``, ``act_failure``, ``crash`` (the desktop
            dies during an action and stays dead until ``recover()``), ``hung_evaluator``
            (``evaluate`` never returns; the engine's ``eval_timeout`` cuts it),
            ``truncated_screenshot`` (``observe`` returns the first half of the PNG, as a
            desktop whose connection dropped mid-transfer), ``observe_error`` (``observe``
            raises a plain ``OSError``, no ``DesktopError``)
  frames    how many distinct screens to show (default 8; each is drawn and encoded once per
            process when first shown: ~15 ms of CPU at 1280x720, ~45 ms at 1920x1080)
  unique    every observation is a distinct PNG (the pooled picture plus a ``tEXt`` chunk
            naming the desktop and observation), so storage is measured as with real screens

``observe(size=(w, h))`` hands out the screen at the model's size (the engine asks for it):
each pooled screen is resized once per process (:meth:`FramePool.model`, the collector's
own resize), and a unique observation is that PNG plus its ``tEXt`` chunk.
  seed      seeds latencies and faults (default 0)

Rewards: a task's success probability is ``config["fake"]["success"]`` (inline task config,
default 0.5); the reward of a logical attempt is drawn from the per-attempt seed the engine
passes to ``reset``, so the same attempt always gets the same reward, whatever desktop runs it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import struct
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...actions import Action
from ...errors import ConfigError, DesktopError
from ...images import Screenshot, resized_png
from ...tasks import Evaluation, Task
from ..base import DesktopConfig, Wait
from ..registry import BackendSpec, Capabilities, register

PHASES = ("reset", "act", "observe", "evaluate")
FAULTS = (
    "reset_failure",
    "act_failure",
    "crash",
    "hung_evaluator",
    "truncated_screenshot",
    "observe_error",
)

FRAMES = 8
"""Distinct screens by default: each costs its encode once per process (a start-up cost of
every fake batch), and ``unique`` makes every observation distinct anyway."""


class FakeOptions(BaseModel):
    """The fake backend's options (module docs); ``latency`` and ``faults`` are checked
    further by :class:`FakeDesktop` (phases, fault names, probabilities)."""

    model_config = ConfigDict(extra="forbid")

    latency: dict[str, Any] | None = None
    faults: dict[str, Any] | None = None
    frames: int = Field(FRAMES, ge=1)
    seed: int | str = 0
    unique: bool = False


class Latency:
    """A latency distribution in seconds: fixed, lognormal(median, sigma), uniform, exponential.

    Raises ``ConfigError`` naming ``field`` when the spec is malformed.
    """

    def __init__(self, spec: Any, field: str):
        self.spec = spec
        if isinstance(spec, (int, float)) and spec >= 0:
            self._draw = lambda rng, v=float(spec): v
            self.mean_hint = float(spec)
            return
        if not isinstance(spec, dict) or "dist" not in spec:
            raise ConfigError(
                f"{field}: a latency is seconds >= 0 or {{'dist': 'lognormal'|'uniform'|'exponential', ...}}"
            )
        dist = spec["dist"]
        try:
            if dist == "lognormal":
                import math

                mu, sigma = math.log(float(spec["median"])), float(spec.get("sigma", 0.5))
                self._draw = lambda rng: rng.lognormvariate(mu, sigma)
            elif dist == "uniform":
                lo, hi = float(spec["low"]), float(spec["high"])
                self._draw = lambda rng: rng.uniform(lo, hi)
            elif dist == "exponential":
                mean = float(spec["mean"])
                self._draw = lambda rng: rng.expovariate(1.0 / mean)
            else:
                raise ConfigError(
                    f"{field}.dist: unknown distribution {dist!r} (lognormal, uniform, exponential)"
                )
        except (KeyError, ValueError) as exc:
            raise ConfigError(
                f"{field}: missing or bad parameter {exc} for dist {dist!r}"
            ) from None

    def draw(self, rng: random.Random) -> float:
        return self._draw(rng)


class FramePool:
    """The fake desktops' screens of one size, ``frames`` distinct desktop-like pictures (title
    bar, window, text lines), each drawn when first shown and encoded as PNG when first asked
    for: at full size (:meth:`full`) or resized to a model's size (:meth:`model`, by
    :func:`~legato_pipelines.images.resized_png`, so its bytes are what the collector would
    make of the full-size PNG). Pictures use Pillow's bitmap font (no FreeType: ~4x cheaper to
    draw). One per process and size (:func:`pool`); used from the event loop's thread."""

    def __init__(self, width: int, height: int, frames: int):
        self.width, self.height, self.frames = width, height, frames
        self._pictures: dict[int, Any] = {}
        self._full: dict[int, Screenshot] = {}
        self._model: dict[tuple[int, tuple[int, int]], Screenshot] = {}

    def picture(self, index: int):
        """Screen ``index`` as a PIL image (RGB), drawn once."""
        picture = self._pictures.get(index)
        if picture is None:
            picture = self._pictures[index] = _draw(self.width, self.height, index)
        return picture

    def full(self, index: int) -> Screenshot:
        """Screen ``index`` as a PNG of the whole screen (zlib level 1)."""
        shot = self._full.get(index)
        if shot is None:
            shot = self._full[index] = Screenshot.from_pil(self.picture(index))
        return shot

    def model(self, index: int, size: tuple[int, int]) -> Screenshot:
        """Screen ``index`` resized to ``size`` (width, height) as the collector would."""
        shot = self._model.get((index, size))
        if shot is None:
            shot = Screenshot(resized_png(self.picture(index), size), *size)
            self._model[index, size] = shot
        return shot


@functools.lru_cache(maxsize=8)
def pool(width: int, height: int, frames: int = FRAMES) -> FramePool:
    """The process's :class:`FramePool` of ``frames`` screens of ``width`` x ``height``."""
    return FramePool(width, height, frames)


def frame_pool(width: int, height: int, frames: int = FRAMES) -> tuple[Screenshot, ...]:
    """Every screen of :func:`pool` as a full-size PNG (drawn and encoded now, once per
    process, so a benchmark can do it outside its measurement)."""
    screens = pool(width, height, frames)
    return tuple(screens.full(i) for i in range(frames))


def _draw(width: int, height: int, i: int):
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default_imagefont()
    rng = random.Random(i)
    img = Image.new("RGB", (width, height), (40 + i * 3 % 60, 60, 90))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, width, 28], fill=(30, 30, 30))
    draw.text((10, 8), f"legato fake desktop - screen {i}", fill=(230, 230, 230), font=font)
    x0, y0 = rng.randint(20, width // 4), rng.randint(40, height // 4)
    x1, y1 = rng.randint(width // 2, width - 20), rng.randint(height // 2, height - 20)
    draw.rectangle([x0, y0, x1, y1], fill=(245, 245, 245), outline=(0, 0, 0))
    for line in range(max(1, (y1 - y0 - 30) // 18)):
        words = " ".join(
            hashlib.sha1(f"{i}-{line}-{k}".encode()).hexdigest()[: rng.randint(3, 9)]
            for k in range(rng.randint(3, 12))
        )
        draw.text((x0 + 10, y0 + 10 + line * 18), words, fill=(20, 20, 20), font=font)
    return img


def _with_text(png: bytes, text: str) -> bytes:
    """``png`` with a ``tEXt`` chunk (keyword ``legato``) inserted after IHDR: same pixels,
    different bytes, no re-encoding (PNG spec: length, type, data, CRC-32 of type + data)."""
    data = b"legato\x00" + text.encode()
    chunk = (
        struct.pack(">I", len(data))
        + b"tEXt"
        + data
        + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    )
    return png[:33] + chunk + png[33:]  # 8-byte signature + 25-byte IHDR chunk


class FakeDesktop:
    """A desktop that sleeps its configured latencies, shows pre-rendered screens, grades with
    the per-attempt seed, and fails on purpose at the configured rates (see module docs)."""

    observe_resizes = True  # observe(size=) hands out the model-size screen (base.py)

    def __init__(self, config: DesktopConfig, index: int = 0):
        opts = SPEC.check_options(config.options)
        latency = opts.latency or {}
        if not isinstance(latency, dict) or set(latency) - set(PHASES):
            raise ConfigError(f"desktop.options.latency: a mapping with keys among {PHASES}")
        self.latency = {
            p: Latency(latency.get(p, 0.0), f"desktop.options.latency.{p}") for p in PHASES
        }
        faults = opts.faults or {}
        if not isinstance(faults, dict) or set(faults) - set(FAULTS):
            raise ConfigError(f"desktop.options.faults: a mapping with keys among {FAULTS}")
        self.faults = {f: float(faults.get(f, 0.0)) for f in FAULTS}
        for name, p in self.faults.items():
            if not 0.0 <= p <= 1.0:
                raise ConfigError(
                    f"desktop.options.faults.{name}: a probability in [0, 1], got {p}"
                )
        self.config = config
        self.name = f"fake-{index}"
        self.screen_size = config.screen_size
        self._rng = random.Random(f"{opts.seed}:{index}")
        self._frames = pool(config.screen_width, config.screen_height, frames=opts.frames)
        self._unique = opts.unique
        self._observations = 0
        self._crashed = False
        self._frame = 0
        self._task_offset = 0
        self._reward = 0.0
        self.resets = 0
        self.recoveries = 0

    async def _sleep(self, phase: str) -> None:
        delay = self.latency[phase].draw(self._rng)
        if delay > 0:
            await asyncio.sleep(delay)

    def _check_alive(self) -> None:
        if self._crashed:
            raise DesktopError(f"{self.name}: desktop crashed (recover it first)", kind="crash")

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        self._check_alive()
        await self._sleep("reset")
        if self._rng.random() < self.faults["reset_failure"]:
            raise DesktopError(f"{self.name}: injected reset failure", kind="reset")
        self.resets += 1
        success = (task.config.get("fake") or {}).get("success", 0.5)
        self._reward = 1.0 if random.Random(seed).random() < float(success) else 0.0
        self._task_offset = int(hashlib.sha1(task.task_id.encode()).hexdigest()[:6], 16)
        self._frame = 0
        return "fast" if self.config.fast_reset else "revert"

    async def _wait(self) -> Wait:
        if self.config.fixed_wait:
            await asyncio.sleep(self.config.fixed_wait)
            return Wait(self.config.fixed_wait, None)
        ready = self.config.ready_signal
        return Wait(0.0, 0.0 if ready else None, False if ready else None)

    async def wait_after_reset(self) -> Wait:
        return await self._wait()

    async def observe(self, size: tuple[int, int] | None = None) -> Screenshot:
        """The current screen; at the model's ``size`` (width, height) when given, resized as
        the collector would (:meth:`FramePool.model`), so the collector has no pixel work."""
        self._check_alive()
        await self._sleep("observe")
        index = (self._task_offset + self._frame) % self._frames.frames
        if size is not None and tuple(size) != self.screen_size:
            frame = self._frames.model(index, tuple(size))
        else:
            frame = self._frames.full(index)
        if self._rng.random() < self.faults["observe_error"]:
            raise OSError(f"{self.name}: injected screenshot read error")
        if self._rng.random() < self.faults["truncated_screenshot"]:
            return Screenshot(frame.png[: len(frame.png) // 2], frame.width, frame.height)
        if not self._unique:
            return frame
        self._observations += 1
        return Screenshot(
            _with_text(frame.png, f"{self.name}:{self._observations}"), frame.width, frame.height
        )

    async def act(self, action: Action) -> None:
        self._check_alive()
        await self._sleep("act")
        if self._rng.random() < self.faults["crash"]:
            self._crashed = True
            raise DesktopError(
                f"{self.name}: injected desktop crash during {action.action}", kind="crash"
            )
        if self._rng.random() < self.faults["act_failure"]:
            raise DesktopError(
                f"{self.name}: injected action failure ({action.action})", kind="act"
            )
        self._frame += 1

    async def wait_after_action(self, action: Action) -> Wait:
        return await self._wait()

    async def wait_before_eval(self) -> Wait:
        return await self._wait()

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        self._check_alive()
        if self._rng.random() < self.faults["hung_evaluator"]:
            await asyncio.Event().wait()  # never returns; the engine's eval_timeout cuts it
        await self._sleep("evaluate")
        return Evaluation(self._reward)

    async def recover(self) -> None:
        self._crashed = False
        self.recoveries += 1

    async def close(self) -> None:
        return None


async def open_fake_desktops(config: DesktopConfig, n: int, first: int = 0) -> list[FakeDesktop]:
    """``n`` fake desktops named ``fake-<first>`` on; ``ConfigError`` for bad options."""
    return [FakeDesktop(config, i) for i in range(first, first + n)]


def _support(options: Any, desktops: int):
    from ...osworld_format.classify import BackendSupport
    from ...osworld_format.sources import file_cache_dir

    return BackendSupport(cache_dir=file_cache_dir(dict(options)))


SPEC = register(
    BackendSpec(
        name="fake",
        summary="no VMs: real PNG screens, seeded rewards, configurable latency and faults",
        open=open_fake_desktops,
        options=FakeOptions,
        capabilities=lambda options: Capabilities(
            opens_late=True, scratch=False, task_checks="fake"
        ),
        support=_support,
    )
)
