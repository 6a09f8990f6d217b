"""One verdict per task and backend: the problems that make a task unrunnable there.

:func:`preflight` is what ``legato collect`` (the engine's ``_preflight``) and ``legato tasks
check --backend X`` both call, with the same
:class:`~legato_pipelines.osworld_format.classify.BackendSupport`
(``legato_pipelines.desktops.support.backend_support``): the problems are those of
:func:`~.classify.classify_task`, which also decides ``TaskClass.backends`` from them. So a
task is in ``backends`` exactly when preflight has nothing against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..tasks import Task
from .classify import BackendSupport, classify_task
from .problems import BACKENDS
from .sources import cache_dir_path


def preflight(
    task_set: Iterable[Task],
    backend: str,
    *,
    cache_dir: Path | str | None = None,
    support: BackendSupport | None = None,
) -> list[str]:
    """Human-readable problems that make tasks of ``task_set`` unrunnable on ``backend``.

    Call it before any desktop starts; an empty list means nothing known stops the run. Each
    problem reads ``tasks[<index>] (task_id '<id>'): ... (fix: ...)``.

    ``support``: what the backend offers on this host (apps, pyautogui, grader names, file
    cache); default: :class:`BackendSupport` with ``cache_dir``. The problems are the task
    config's own (:func:`~.problems.task_problems`: misspelled or unknown metric, getter and
    step names with a "did you mean", missing evaluator parts or step parameters, mismatched
    parallel lists, uncached downloads) and, for ``local``, what the host lacks (apps, the
    internet for live websites, pyautogui, OSWorld's GNOME session).

    ``task_set``: a :class:`~legato_pipelines.tasks.TaskSet` or any iterable of ``Task``.
    Raises ``ValueError`` for an unknown ``backend``. Never touches a desktop or the network.
    """
    if backend not in BACKENDS:
        raise ValueError(
            f"preflight: backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if support is None:
        support = BackendSupport(cache_dir=cache_dir_path(cache_dir))
    elif cache_dir is not None:
        support = support.model_copy(update={"cache_dir": cache_dir_path(cache_dir)})
    out: list[str] = []
    for index, task in enumerate(task_set):
        prefix = f"tasks[{index}] (task_id {task.task_id!r}): "
        problems = classify_task(task, backend_support=support).problems[backend]
        out.extend(prefix + p for p in problems)
    return out
