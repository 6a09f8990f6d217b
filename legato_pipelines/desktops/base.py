"""The desktop protocol: the one small interface the engine drives (httpx's transport idea).

The engine never knows which backend it drives. ``fake`` is the mock transport; ``local``
(Xvfb desktops behind a per-desktop HTTP server) and ``osworld`` (DesktopEnv in a worker
process) are the real ones. Every method is ``async`` and must not block the event loop: a
backend that does blocking work runs it in a thread or another process.

Per attempt the engine calls::

    reset(task, seed=) -> wait_after_reset() -> [observe() -> (policy) -> act(a) -> wait_after_action(a)]*
    -> wait_before_eval() -> evaluate(task, last_action_fail=)

and ``recover()`` after any :class:`~legato_pipelines.errors.DesktopError`, before the
desktop takes new work. ``close()`` once at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..actions import Action
from ..images import Screenshot
from ..tasks import Evaluation, Task

Backend = Literal["fake", "local", "osworld"]


@dataclass(frozen=True, slots=True)
class Wait:
    """Time spent waiting for the screen, in seconds.

    ``wait_s`` is the whole wait. ``ready_s`` is the ready signal's answer (seconds until the
    screen was stable), or ``None`` when a fixed wait (the OSWorld-style baseline) was used.
    """

    wait_s: float
    ready_s: float | None = None


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

    async def observe(self) -> Screenshot: ...

    async def act(self, action: Action) -> None:
        """Execute one structured action (never model text as code)."""

    async def wait_after_action(self, action: Action) -> Wait: ...

    async def wait_before_eval(self) -> Wait: ...

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        """Grade the attempt. ``last_action_fail``: the agent's last action was FAIL (OSWorld's
        ``infeasible`` metric scores 1 iff so; any other metric scores 0 after a FAIL)."""

    async def recover(self) -> None:
        """Make a failed desktop usable again (full restart); raise ``DesktopError`` if it can't."""

    async def close(self) -> None: ...


class DesktopConfig(BaseModel):
    """How desktops are made and waited on. Defaults in one place (the httpx ``Timeout`` idea).

    Fields:
      backend       ``fake`` | ``local`` | ``osworld``
      screen_width, screen_height   pixels (1280x720 default; OSWorld VMs are 1920x1080)
      ready_signal  wait until the screen is stable after actions and reset (on by default)
      fixed_wait    seconds to sleep instead (the OSWorld-style baseline; needs ready_signal off)
      fast_reset    fast reset where the task allows it, else full restart / snapshot revert
      eval_timeout  seconds an evaluation may take before the desktop counts as failed
      options       backend-specific options (see each backend's docs)
    """

    model_config = ConfigDict(extra="forbid")

    backend: Backend = "fake"
    screen_width: int = Field(1280, ge=64, le=8192)
    screen_height: int = Field(720, ge=64, le=8192)
    ready_signal: bool = True
    fixed_wait: float | None = Field(None, ge=0)
    fast_reset: bool = True
    eval_timeout: float = Field(120.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)

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


class WaitsByMode:
    """The protocol's three waits over one ``_wait(mode)`` (``"reset"`` | ``"action"`` |
    ``"eval"``), for backends whose waiting differs only by mode. ``terminate`` and ``wait``
    actions change nothing on screen, so they get no screen wait (``ready_s`` 0 with the ready
    signal on, ``None`` with the fixed-wait baseline)."""

    config: DesktopConfig

    async def _wait(self, mode: str) -> Wait:
        raise NotImplementedError

    async def wait_after_reset(self) -> Wait:
        return await self._wait("reset")

    async def wait_after_action(self, action: Action) -> Wait:
        if action.action in ("terminate", "wait"):
            return Wait(0.0, 0.0 if self.config.ready_signal else None)
        return await self._wait("action")

    async def wait_before_eval(self) -> Wait:
        return await self._wait("eval")
