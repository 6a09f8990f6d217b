"""Run config of a collection: the knobs a batch is launched with (the launchpad's form).

Defaults come from the environment where a deployment sets them once (``LEGATO_TASKS``), else
the engine's defaults (:func:`legato_pipelines.collect`). The knobs that describe the policy
server and the desktops are resources, not run config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fake" / "tasks.json"
"""The fake-backend task list shipped with the repository (``legato demo``'s default)."""


def default_tasks() -> str:
    """``LEGATO_TASKS`` if set, else the shipped fake task list."""
    return os.environ.get("LEGATO_TASKS") or str(EXAMPLE_TASKS)


class CollectConfig(dg.Config):
    """Collection knobs of one batch (units in brackets); see :func:`legato_pipelines.collect`."""

    tasks: str = Field(default=default_tasks(), description="Task list JSON (LEGATO_TASKS).")
    group: int = Field(default=4, ge=1, description="Attempts per task: one GRPO group.")
    oversample: float = Field(
        default=0.0, ge=0, description="Extra attempts per group, as a fraction of group."
    )
    max_steps: int = Field(default=15, ge=1, description="Policy calls per attempt.")
    max_inflight: int | None = Field(
        default=None, ge=1, description="Concurrent model requests (default: one per desktop)."
    )
    step_timeout: float = Field(default=60.0, gt=0, description="[s] hard deadline per model call.")
    retries: int = Field(default=1, ge=0, description="Re-tries of a failed model call.")
    rollout_timeout: float | None = Field(
        default=None, gt=0, description="[s] wall-clock cap per attempt (then truncated)."
    )
    env_retries: int = Field(default=1, ge=0, description="New executions after a desktop failure.")
    ready_signal: bool = Field(
        default=True, description="Wait until the screen is stable (off: fixed_wait)."
    )
    fixed_wait: float | None = Field(
        default=None, ge=0, description="[s] fixed wait after actions (needs ready_signal off)."
    )
    fast_reset: bool = Field(default=True, description="Fast reset where the task allows it.")
    image_max: int = Field(default=20, ge=1, description="Screenshots kept in a prompt.")
    harness: Literal["qwen3vl", "qwen25vl"] = Field(
        default="qwen3vl", description="Prompt and action format."
    )
    history: Literal["window", "hysteresis"] = Field(
        default="window", description="How old screenshots leave the prompt."
    )
    seed: int = Field(default=0, description="Seeds attempt seeds (the fake backend's rewards).")
    model: str | None = Field(
        default=None, description="Model id override (set by the sensor's models source)."
    )

    def knobs(self) -> dict:
        """The keyword arguments of :func:`legato_pipelines.collect` these fields set (all but
        the task list and the model override)."""
        return self.model_dump(exclude={"tasks", "model"})
