"""OSWorld's task format on any desktop: setup steps, evaluators (getters + metrics), classification.

The task runtime every backend shares. It drives a desktop only through the
:class:`~legato_pipelines.osworld_format.controller.DesktopController` protocol (the OSWorld server's
base API), so the local backend, the osworld backend's test provider and unit tests with a
directory-backed controller all run the same code::

    await run_setup(task, controller)                           # reset: the task's config steps
    ev = await evaluate_task(task, controller, last_action_fail=False)   # postconfig + metrics
    needs_full_reset(task)                                      # state outside HOME -> revert
    classify_task(task)                                         # what a backend needs to run it
    preflight(task_set, "local")                                # problems that stop a run, per task
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_getattr

#: Names imported on first use (PEP 562): the desktop server needs one constant of
#: ``.controller``, not the evaluators, getters and classification (task schemas, pydantic).
_LAZY = {
    **dict.fromkeys(
        (
            "BackendSupport",
            "TaskClass",
            "TaskTotals",
            "classify_task",
            "needs_full_reset",
            "summarize",
        ),
        ".classify",
    ),
    **dict.fromkeys(
        ("evaluate_task", "evaluate_task_within", "evaluator_unsupported"), ".evaluate"
    ),
    "GETTERS": ".getters",
    "METRICS": ".metrics",
    "task_problems": ".problems",
    "SUPPORTED_STEP_TYPES": ".setup",
    "run_setup": ".setup",
    "UnsupportedStep": ".unsupported",
    "preflight": ".verdict",
}

if TYPE_CHECKING:
    from .classify import (
        BackendSupport,
        TaskClass,
        TaskTotals,
        classify_task,
        needs_full_reset,
        summarize,
    )
    from .evaluate import evaluate_task, evaluate_task_within, evaluator_unsupported
    from .getters import GETTERS
    from .metrics import METRICS
    from .problems import task_problems
    from .setup import SUPPORTED_STEP_TYPES, run_setup
    from .unsupported import UnsupportedStep
    from .verdict import preflight

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = [
    "BackendSupport",
    "GETTERS",
    "METRICS",
    "SUPPORTED_STEP_TYPES",
    "TaskClass",
    "TaskTotals",
    "UnsupportedStep",
    "classify_task",
    "evaluate_task",
    "evaluate_task_within",
    "evaluator_unsupported",
    "needs_full_reset",
    "preflight",
    "run_setup",
    "summarize",
    "task_problems",
]
