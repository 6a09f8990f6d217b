"""Run config of a collection: the knobs a batch is launched with (the launchpad's form).

The knobs are the engine's :class:`~legato_pipelines.rollout.settings.CollectSettings` fields
(names, defaults, units, bounds: one definition), the task list (default from the environment,
``LEGATO_TASKS``) and a model override. The knobs that describe the policy server and the
desktops are resources, not run config (:data:`RESOURCE_SETTINGS`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from ..rollout.settings import CollectSettings
from ..setting_fields import unchecked

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fake" / "tasks.json"
"""The fake-backend task list shipped with the repository (``legato demo``'s default)."""


def default_tasks() -> str:
    """``LEGATO_TASKS`` if set, else the shipped fake task list."""
    return os.environ.get("LEGATO_TASKS") or str(EXAMPLE_TASKS)


RESOURCE_SETTINGS: dict[str, tuple[str, str]] = {"desktops": ("desktops", "desktops")}
"""Collection settings that are resource fields in the code location, not run config:
setting -> (resource key, field). ``desktops`` is how many desktops the pool starts (plus its
``urls``); the engine checks the count."""


class _CollectConfigBase(dg.Config):
    """Collection knobs of one batch: the task list, a model override, the version's adapter
    name, and every
    :class:`~legato_pipelines.rollout.settings.CollectSettings` field but the resource ones
    (same names, defaults, units and bounds)."""

    tasks: str = Field(default=default_tasks(), description="Task list JSON (LEGATO_TASKS).")
    model: str | None = Field(
        default=None, description="Model id override (set by the sensor's models source)."
    )
    adapter: str | None = Field(
        default=None,
        description="Served name of the version for load lora / external (legato collect "
        "--adapter); default: model when set (the sensor's models source), else the version.",
    )

    def settings(self, **resources: Any) -> CollectSettings:
        """The engine's settings: these fields plus the resource ones (``desktops=``). Raises
        ``ConfigError`` naming a bad one and its flag (:func:`~.advice.in_dagster` adds the
        Dagster setting)."""
        return CollectSettings.checked(
            self.model_dump(exclude={"tasks", "model", "adapter"}), **resources
        )


CollectConfig = create_model(
    "CollectConfig",
    __base__=_CollectConfigBase,
    __module__=__name__,
    __doc__=_CollectConfigBase.__doc__,
    **{
        name: (field.annotation, unchecked(field))
        for name, field in CollectSettings.model_fields.items()
        if name not in RESOURCE_SETTINGS
    },
)
