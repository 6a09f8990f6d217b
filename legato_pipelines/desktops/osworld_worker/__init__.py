"""The OSWorld worker building block: OSWorld's DesktopEnv in a worker process under its own
interpreter.

``desktop.py`` (project side, asyncio: the ``osworld`` backend's desktop) drives ``worker.py``
(OSWorld side: stdlib and ``desktop_env`` only) over JSON lines (``channel.py``);
``provider_local.py`` is the worker-side provider whose "VM" is a project desktop server;
``install.py`` builds the OSWorld interpreter; ``desktop_grader.py`` attaches a worker to a
desktop server as its OSWorld grader (the ``local`` backend's ``grader=osworld``).

What other building blocks may use (this face): the worker channel, its clean environment,
the shared template its workers are forked from (``template.py``), the attached grader and
the choice of grader.
"""

from typing import TYPE_CHECKING

from ...lazy import lazy_getattr

#: Names imported on first use (PEP 562): ``install.py`` and the workers' environment are
#: needed on ``legato``'s first line (``desktops/early.py``), before pydantic and the task
#: format that ``grader.py`` imports.
_LAZY = {
    "OSWorldGrader": ".desktop_grader",
    "WorkerProcess": ".channel",
    "confinement": ".channel",
    "desktop_ports": ".channel",
    "hand_over": ".confine",
    "prepare_dir": ".confine",
    "installed_grader": ".grader",
    "local_grader": ".grader",
    "osworld_python": ".install",
    "worker_env": "..child_env",
    "WorkerTemplate": ".template",
    "acquire_template": ".template",
    "release_template": ".template",
    "template_started": ".template",
}

if TYPE_CHECKING:
    from ..child_env import worker_env
    from .channel import WorkerProcess, confinement, desktop_ports
    from .confine import hand_over, prepare_dir
    from .desktop_grader import OSWorldGrader
    from .grader import installed_grader, local_grader
    from .install import osworld_python
    from .template import WorkerTemplate, acquire_template, release_template, template_started

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = [
    "OSWorldGrader",
    "WorkerProcess",
    "WorkerTemplate",
    "acquire_template",
    "confinement",
    "desktop_ports",
    "hand_over",
    "prepare_dir",
    "installed_grader",
    "local_grader",
    "osworld_python",
    "release_template",
    "template_started",
    "worker_env",
]
