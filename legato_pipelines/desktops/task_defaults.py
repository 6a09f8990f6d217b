"""Desktop defaults derived from the task set at load time: OSWorld's tasks get OSWorld's VM.

A task set whose every task comes from an OSWorld checkout or index (``Task.source``
``osworld:<path>``, :func:`..tasks.load_tasks`) runs, unless the desktop config says
otherwise, on OSWorld's screen (:data:`OSWORLD_SCREEN`, 1920x1080, the VM's) and, with a
backend that has a ``session`` option (the local one, ``backends/local.py``), in the VM's
look (:data:`OSWORLD_SESSION`: ``vm``, docs/local-desktop.md §18). Inline configs (the local
suite, the tests' copies of OSWorld configs) keep :class:`.base.DesktopConfig`'s defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..tasks import Task
from .base import DesktopConfig

#: OSWorld VM's screen (width, height) in pixels.
OSWORLD_SCREEN = (1920, 1080)
#: The desktop session of a backend with a ``session`` option, for OSWorld's tasks.
OSWORLD_SESSION = "vm"


def from_osworld(tasks: Sequence[Task]) -> bool:
    """True when there are tasks and every one was read from an OSWorld checkout or index."""
    return bool(tasks) and all(task.source.startswith("osworld:") for task in tasks)


def for_tasks(desktop: DesktopConfig, tasks: Sequence[Task]) -> tuple[DesktopConfig, dict]:
    """``desktop`` with the defaults of ``tasks`` filled in where ``desktop`` leaves them
    unset (``model_fields_set``; an option absent from ``options``), and what was filled
    (``{"screen": "1920x1080", "session": "vm"}``, for the run's knobs; ``{}``: nothing)."""
    if not from_osworld(tasks):
        return desktop, {}
    from .registry import get

    update: dict = {}
    filled: dict = {}
    if not {"screen_width", "screen_height"} & desktop.model_fields_set:
        update["screen_width"], update["screen_height"] = OSWORLD_SCREEN
        filled["screen"] = "{}x{}".format(*OSWORLD_SCREEN)
    if "session" in get(desktop.backend).options.model_fields and "session" not in desktop.options:
        update["options"] = {**desktop.options, "session": OSWORLD_SESSION}
        filled["session"] = OSWORLD_SESSION
    if not update:
        return desktop, {}
    return desktop.model_copy(update=update), filled
