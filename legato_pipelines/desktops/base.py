"""The desktop protocol: the one small interface the engine drives (httpx's transport idea).

The engine never knows which backend it drives. ``fake`` is the mock transport; ``local``
(Xvfb desktops behind a per-desktop HTTP server) and ``osworld`` (DesktopEnv in a worker
process) are the real ones. Every method is ``async`` and must not block the event loop: a
backend that does blocking work runs it in a thread or another process.

Per attempt the engine calls::

    reset(task, seed=) -> wait_after_reset() -> [observe() -> (policy) -> act(a) -> wait_after_action(a)]*
    -> wait_before_eval() -> evaluate(task, last_action_fail=)

and ``recover()`` after any :class:`~legato_pipelines.errors.DesktopError`, before the
desktop takes new work. ``close()`` once at the end. The agent's ``terminate`` is not an
action on the screen: the engine never passes it to ``act``; it ends the attempt and reaches
the desktop as ``evaluate(task, last_action_fail=)`` (True after ``terminate`` with status
``failure``).

Every wait is named in :class:`Waits` (``DesktopConfig.waits``) and reported as a
:class:`Wait` (``wait_s``, ``ready_s``, ``timed_out``), which the engine records per action.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..actions import Action
from ..errors import DesktopError
from ..harness.render import not_typed_in, render_osworld_code
from ..images import Screenshot
from ..osworld_format.controller import EXECUTE_TIMEOUT_S
from ..tasks import Evaluation, Task
from .registry import DEFAULT_BACKEND, get


@dataclass(frozen=True, slots=True)
class Wait:
    """Time spent waiting for the screen, in seconds.

    ``wait_s`` is the whole wait. ``ready_s`` is the ready signal's answer (seconds until the
    screen was stable), or ``None`` when a fixed wait (the OSWorld-style baseline) was used.
    ``timed_out``: the ready signal hit its cap (:class:`Waits`) before the screen was stable;
    ``None`` with a fixed wait. ``undrawn``: the wait ended with an app's window still blank
    or the app still loading (a desktop server's content wait), so the screen handed out next
    shows it undrawn; ``None`` where the backend cannot tell.
    """

    wait_s: float
    ready_s: float | None = None
    timed_out: bool | None = None
    undrawn: bool | None = None


@runtime_checkable
class Desktop(Protocol):
    """One desktop, owned by one engine worker. Methods raise ``DesktopError`` on failure."""

    name: str
    screen_size: tuple[int, int]  # (width, height) in pixels

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        """Bring the desktop to the task's start state; return ``"fast"`` or ``"revert"``.

        ``seed`` is derived by the engine from (run seed, task_id, attempt): the same logical
        attempt always gets the same seed (the ``fake`` backend draws its reward from it;
        real backends may ignore it).
        """

    async def wait_after_reset(self) -> Wait: ...

    async def observe(self) -> Screenshot:
        """The screen as a PNG :class:`~legato_pipelines.images.Screenshot`.

        A backend whose class sets ``observe_resizes = True`` is called as
        ``observe(size=(w, h))`` with the model's size (the harness's ``smart_resize`` of
        ``screen_size``) and hands out the screen resized to it by
        :func:`~legato_pipelines.images.resized_png`, where the pixels are (so the collector
        only hashes and stores it); a screenshot of another size is resized by the engine.
        Backends that cannot resize are called as ``observe()``."""

    async def act(self, action: Action) -> dict[str, Any] | None:
        """Execute one structured action (never model text as code). ``wait`` sleeps
        ``action.seconds`` (else ``Waits.wait_action_s``); ``terminate`` never comes here.

        Returns ``None``, or facts about how the action was carried out that the engine
        records on it: ``{"not_typed": "€"}`` when characters of a ``type`` did not reach the
        desktop (:func:`act_facts`)."""

    async def wait_after_action(self, action: Action) -> Wait: ...

    async def wait_before_eval(self) -> Wait: ...

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        """Grade the attempt. ``last_action_fail``: the agent's last action was FAIL (OSWorld's
        ``infeasible`` metric scores 1 iff so; any other metric scores 0 after a FAIL)."""

    async def recover(self) -> None:
        """Make a failed desktop usable again (full restart); raise ``DesktopError`` if it can't."""

    async def close(self) -> None: ...


class Waits(BaseModel):
    """Every wait and timeout of a desktop, in seconds, with its default in one place.

    ready_after_action_s  cap of the ready signal after an action (then ``timed_out``)
    ready_after_reset_s   cap of the ready signal after a reset and the task's setup
    ready_before_eval_s   cap of the ready signal before grading
    ready_app_window_s    cap of a reset's wait for the main window of an app the task's
                          setup launched, when longer than ``ready_after_reset_s`` (GIMP's
                          comes 2.5-6.8 s after launch on a quiet machine, past 10 s on a
                          loaded one); the wait ends as soon as the window is up
    wait_action_s         a ``wait`` action without ``seconds``
    execute_timeout_s     one command of OSWorld's ``/execute`` (a setup step's command, an
                          action's pyautogui code): OSWorld's own ``subprocess.run`` timeout
    settle_after_reset_s  after the reset's ready wait, keep watching for windows nobody asked
                          for (an "updates available" dialog) this long before the first
                          screenshot is handed out (0: none; the check before the first
                          action still covers the policy's first call)

    Set them as ``DesktopConfig(waits=...)``, or by name among the desktop options
    (``--desktop-option ready_after_action_s=8``, ``LEGATO_BACKEND_OPTIONS``, the Dagster
    desktop resource's ``options``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ready_after_action_s: float = Field(5.0, gt=0)
    ready_after_reset_s: float = Field(10.0, gt=0)
    ready_before_eval_s: float = Field(5.0, gt=0)
    ready_app_window_s: float = Field(30.0, gt=0)
    wait_action_s: float = Field(1.0, ge=0)
    execute_timeout_s: float = Field(EXECUTE_TIMEOUT_S, gt=0)
    settle_after_reset_s: float = Field(0.0, ge=0)

    def ready_cap(self, mode: str) -> float:
        """The cap of the ready wait of ``mode`` (``reset`` | ``action`` | ``eval``)."""
        return {
            "reset": self.ready_after_reset_s,
            "action": self.ready_after_action_s,
            "eval": self.ready_before_eval_s,
        }[mode]

    def wait_action(self, action: Action) -> float:
        """Seconds a ``wait`` action sleeps."""
        return action.seconds if action.seconds is not None else self.wait_action_s


class DesktopConfig(BaseModel):
    """How desktops are made and waited on. Defaults in one place (the httpx ``Timeout`` idea).

    Fields:
      backend       a registered backend's name (:mod:`.registry`; default
                    :data:`.registry.DEFAULT_BACKEND`)
      screen_width, screen_height   pixels (1280x720 default; OSWorld VMs are 1920x1080)
      ready_signal  wait until the screen is stable after actions and reset (on by default)
      fixed_wait    seconds to sleep instead (the OSWorld-style baseline; needs ready_signal off)
      fast_reset    fast reset where the task allows it, else full restart / snapshot revert
      eval_timeout  seconds an evaluation may take before the desktop counts as failed
      waits         the named waits and timeouts (:class:`Waits`); its fields may also be
                    given by name in ``options``, which hands them over
      options       backend-specific options (see each backend's docs)
    """

    model_config = ConfigDict(extra="forbid")

    backend: str = DEFAULT_BACKEND
    screen_width: int = Field(1280, ge=64, le=8192)
    screen_height: int = Field(720, ge=64, le=8192)
    ready_signal: bool = True
    fixed_wait: float | None = Field(None, ge=0)
    fast_reset: bool = True
    eval_timeout: float = Field(120.0, gt=0)
    waits: Waits = Field(default_factory=Waits)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("backend")
    @classmethod
    def _registered(cls, name: str) -> str:
        """A registered backend (:func:`.registry.get`; ``ValueError`` naming the known ones)."""
        get(name)
        return name

    @model_validator(mode="before")
    @classmethod
    def _waits_from_options(cls, data: Any) -> Any:
        """Fields of :class:`Waits` given among ``options`` (the CLI's ``--desktop-option``,
        the Dagster resource) move into ``waits``."""
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
            return data
        named = {k: v for k, v in data["options"].items() if k in Waits.model_fields}
        if not named:
            return data
        waits = data.get("waits") or {}
        waits = waits.model_dump() if isinstance(waits, Waits) else dict(waits)
        options = {k: v for k, v in data["options"].items() if k not in named}
        return {**data, "waits": {**waits, **named}, "options": options}

    @model_validator(mode="after")
    def _wait_mode(self) -> DesktopConfig:
        if self.fixed_wait is not None and self.ready_signal:
            raise ValueError(
                "fixed_wait is the baseline without the ready signal: set ready_signal=False (--no-ready-signal) too"
            )
        return self

    @property
    def screen_size(self) -> tuple[int, int]:
        return (self.screen_width, self.screen_height)


def check_options(config: DesktopConfig) -> BaseModel:
    """``config.options`` as its backend's options model (:meth:`.registry.BackendSpec.check_options`).
    Raises ``ConfigError`` naming the options the backend does not know, or a wrong value."""
    from .registry import check_options as registry_check

    return registry_check(config.backend, config.options)


def screenshot_of(png: bytes, name: str, kind: str = "observe") -> Screenshot:
    """The :class:`Screenshot` of a server's PNG; ``DesktopError(kind)`` when it is not one."""
    try:
        return Screenshot(png)
    except ValueError:
        raise DesktopError(
            f"{name}: the desktop sent a screenshot that is not a PNG", kind=kind
        ) from None


def act_facts(action: Action, output: str | None) -> dict[str, Any] | None:
    """The facts of an action run as :func:`osworld_code` from the command's stdout:
    ``{"not_typed": chars}`` when a ``type`` reported characters it could not type, else
    ``None``."""
    if action.action != "type":
        return None
    missed = not_typed_in(output)
    return {"not_typed": missed} if missed else None


def osworld_code(action: Action, name: str) -> str:
    """The pyautogui code OSWorld's ``DesktopEnv.step`` runs for ``action``
    (:func:`~legato_pipelines.harness.render.render_osworld_code`); ``DesktopError(kind="act")``
    naming desktop ``name`` when the action cannot be rendered."""
    try:
        return render_osworld_code(action)
    except ValueError as exc:
        raise DesktopError(f"{name}: cannot render {action.action}: {exc}", kind="act") from None


class WaitsByMode:
    """The protocol's three waits over one ready wait per mode (``"reset"`` | ``"action"`` |
    ``"eval"``), for backends whose waiting differs only by mode: the fixed-wait baseline
    sleeps ``fixed_wait``; else :meth:`_ready` waits for a stable screen, capped by
    ``config.waits``. A ``wait`` action changes nothing on screen, so it gets no screen wait
    (``ready_s`` 0 with the ready signal on, ``None`` with the fixed-wait baseline)."""

    config: DesktopConfig

    async def _ready(
        self, mode: str, cap_s: float
    ) -> tuple[float, bool] | tuple[float, bool, bool]:
        """Wait until the screen is stable, at most ``cap_s`` seconds; ``(ready_s, timed_out)``,
        or ``(ready_s, timed_out, undrawn)`` from a backend that tells (:class:`Wait`)."""
        raise NotImplementedError

    async def _wait(self, mode: str) -> Wait:
        t0 = time.perf_counter()
        if not self.config.ready_signal:
            await asyncio.sleep(self.config.fixed_wait or 0.0)
            return Wait(time.perf_counter() - t0, None)
        ready_s, timed_out, *undrawn = await self._ready(mode, self.config.waits.ready_cap(mode))
        return Wait(time.perf_counter() - t0, ready_s, timed_out, undrawn[0] if undrawn else None)

    async def wait_after_reset(self) -> Wait:
        return await self._wait("reset")

    async def wait_after_action(self, action: Action) -> Wait:
        if action.action == "wait":
            ready = self.config.ready_signal
            return Wait(0.0, 0.0 if ready else None, False if ready else None)
        return await self._wait("action")

    async def wait_before_eval(self) -> Wait:
        return await self._wait("eval")
