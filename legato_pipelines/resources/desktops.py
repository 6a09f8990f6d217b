"""``DesktopPoolResource``: which desktops a batch runs on, and how many.

One resource for the three backends of the desktop protocol (``fake``: no VMs, the mock
transport; ``local``: Xvfb desktops on this host; ``osworld``: OSWorld's DesktopEnv), chosen
by ``backend``; backend-specific knobs go in ``options`` (see each backend's module). The
engine starts and closes the desktops within the run.
"""

from __future__ import annotations

from typing import Any, Literal

import dagster as dg
from pydantic import Field

from ..desktops.base import DesktopConfig


class DesktopPoolResource(dg.ConfigurableResource):
    """Fields: ``backend`` (fake | local | osworld; LEGATO_BACKEND), ``desktops`` (how many at
    once; LEGATO_DESKTOPS), ``screen_width``/``screen_height`` [pixels], ``eval_timeout`` [s]
    per evaluation, ``options`` (backend-specific), ``osworld`` (an OSWorld checkout, needed by
    task lists that name OSWorld tasks by domain and id)."""

    backend: Literal["fake", "local", "osworld"] = Field(
        default="fake", description="Desktop backend (LEGATO_BACKEND)."
    )
    # No ge=1 here: an EnvVar.int placeholder is validated as 0; the engine checks the count.
    desktops: int = Field(default=4, description="Desktops run at once (LEGATO_DESKTOPS).")
    screen_width: int = Field(default=1280, ge=64, le=8192, description="Pixels.")
    screen_height: int = Field(default=720, ge=64, le=8192, description="Pixels.")
    eval_timeout: float = Field(default=120.0, gt=0, description="Seconds an evaluation may take.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Backend-specific options (LEGATO_BACKEND_OPTIONS, JSON)."
    )
    osworld: str | None = Field(
        default=None, description="OSWorld checkout for domain/id task lists (LEGATO_OSWORLD)."
    )

    def config(self) -> DesktopConfig:
        """The engine's :class:`DesktopConfig` (the run's wait and reset knobs are passed to
        ``collect`` separately and override its defaults)."""
        return DesktopConfig(
            backend=self.backend,
            screen_width=self.screen_width,
            screen_height=self.screen_height,
            eval_timeout=self.eval_timeout,
            options=dict(self.options),
        )
