"""The ``osworld`` backend: OSWorld's DesktopEnv in a worker process under its own interpreter.

``backend.py`` (project side, asyncio) drives ``worker.py`` (OSWorld side: stdlib and
``desktop_env`` only) over JSON lines; ``provider_local.py`` is the worker-side provider whose
"VM" is a project local desktop server; ``install.py`` builds the OSWorld interpreter.

What other backends may use (the local backend attaches a worker to its desktops as their
OSWorld grader: ``desktops/local/osworld_grader.py``): the worker channel, its clean
environment, the shared template its workers are forked from (``template.py``) and the
choice of grader.
"""

from .channel import WorkerProcess
from .grader import installed_grader, local_grader, osworld_python
from .options import worker_env
from .template import WorkerTemplate, acquire_template, release_template, template_started

__all__ = [
    "WorkerProcess",
    "WorkerTemplate",
    "acquire_template",
    "installed_grader",
    "local_grader",
    "osworld_python",
    "release_template",
    "template_started",
    "worker_env",
]
