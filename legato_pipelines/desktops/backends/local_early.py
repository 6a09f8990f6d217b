"""The local backend's templates to start on ``legato``'s first line (``desktops/early.py``):
stdlib and the project's light modules only, as that line runs before pydantic is imported
(the backend's module, ``local.py``, is not). Named by :data:`..registry.EARLY`."""

from __future__ import annotations

from typing import Any


def templates_for(options: dict[str, Any]) -> list[tuple[list[str], dict[str, str], bool]]:
    """``(command line, environment, whether it runs in a directory of its own)`` of each
    template a local batch with desktop ``options`` forks from: the desktop server template
    unless desktops are attached by URL (option ``urls``), and the OSWorld graders' template
    unless option ``grader=own`` or no OSWorld interpreter is found (option
    ``osworld_python``, else the default venv)."""
    templates = []
    if not options.get("urls"):
        from ..server.template import template_command

        templates.append((*template_command(), False))
    if options.get("grader", "auto") != "own":
        from ..osworld_worker.install import osworld_python

        python = osworld_python(options)
        if python is not None:
            from ..osworld_worker.template import preloading_command

            templates.append((*preloading_command(str(python)), True))
    return templates
