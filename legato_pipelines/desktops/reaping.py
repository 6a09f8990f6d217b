"""The SIGCHLD handler of the fork templates: the desktop server template
(``server/template.py``) and the osworld worker template (``osworld_worker/worker.py``).

Standard library only: the osworld worker runs under OSWorld's interpreter and loads this
module by its path.
"""

from __future__ import annotations

import os


def reap_children(signum, frame) -> None:
    """SIGCHLD of a template: reap every ended child at once (not ``SIG_IGN``, which would
    drop their CPU from the template's ``RUSAGE_CHILDREN``)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
