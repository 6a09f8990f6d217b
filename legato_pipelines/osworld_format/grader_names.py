"""The names a grader knows: metrics, getters and setup step types, per grader.

Two graders run OSWorld-format tasks on the local backend: OSWorld's own code (desktop-env in
its venv, through the osworld worker: ``desktops/osworld_worker/grader.py``) and, without that venv,
this package's own subset (:mod:`.setup`, :mod:`.getters`, :mod:`.metrics`). A task naming a
metric, getter or step type its grader lacks cannot run; :mod:`.problems` says so before any
desktop starts, against the :class:`GraderNames` of the grader that will run it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from .getters import GETTERS
from .metrics import METRICS
from .setup import SUPPORTED_STEP_TYPES

GraderKind = Literal["osworld", "own"]


class StepParameters(BaseModel):
    """One setup step handler's parameters: ``required`` (no default) and ``accepted`` (every
    name it takes; ``None`` when it also takes ``**kwargs``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    required: tuple[str, ...]
    accepted: tuple[str, ...] | None


class GraderNames(BaseModel):
    """What one grader offers.

    ``kind``: ``osworld`` (desktop-env's own SetupController and ``DesktopEnv.evaluate``) or
    ``own`` (this package's subset); ``source``: a human name for messages (e.g.
    ``desktop-env 1.0.2``); ``metrics``: metric function names (OSWorld's ``func``);
    ``getters``: getter types (OSWorld's ``{"type": ...}``, without the ``get_`` prefix);
    ``step_types``: setup/postconfig step types; ``step_parameters``: per step type, the
    parameters its handler cannot run without (``required``) and all it takes (``accepted``;
    ``None``: any), from desktop-env's ``SetupController._<type>_setup`` signatures (empty:
    unknown, e.g. the own subset, whose required parameters :mod:`.problems` lists).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: GraderKind
    source: str
    metrics: frozenset[str]
    getters: frozenset[str]
    step_types: frozenset[str]
    step_parameters: dict[str, StepParameters] = {}


#: This package's own subset: the local backend's grader when there is no OSWorld venv.
OWN_GRADER = GraderNames(
    kind="own",
    source="legato's own OSWorld subset (no OSWorld venv: `legato osworld install`)",
    metrics=frozenset(METRICS),
    getters=frozenset(GETTERS),
    step_types=frozenset(SUPPORTED_STEP_TYPES),
)


def osworld_grader(names: dict, where: str = "") -> GraderNames:
    """:class:`GraderNames` of desktop-env from the worker's ``--names`` answer
    (``{"version", "metrics", "getters", "step_types", "step_parameters"}``); ``where`` (the
    interpreter) is added to the source. Raises ``KeyError`` for an answer missing one of them
    (an answer cached by an older worker: ask again)."""
    source = f"desktop-env {names.get('version', '?')}" + (f" ({where})" if where else "")
    return GraderNames(
        kind="osworld",
        source=source,
        metrics=frozenset(names["metrics"]),
        getters=frozenset(names["getters"]),
        step_types=frozenset(names["step_types"]),
        step_parameters={k: StepParameters(**v) for k, v in names["step_parameters"].items()},
    )
