"""What a backend offers on this host, for the one task verdict (``osworld_format.verdict``).

``legato tasks check --backend X`` and the engine's preflight both call
:func:`backend_support` and then :func:`~legato_pipelines.osworld_format.verdict.preflight`,
so a task the check refuses never starts and one it accepts never fails for a reason either
could have known: apps the local desktops lack, pyautogui on them, the internet vs. the file
cache, and names (setup step types, metrics, getters) against the grader the run will use:
OSWorld's own (the installed desktop-env's lists) or the project's own subset. Each backend
answers for itself (its ``support`` in :mod:`.registry`).
"""

from __future__ import annotations

from typing import Any

from ..osworld_format.classify import BackendSupport
from .registry import check_options, get


def backend_support(
    backend: str, options: dict[str, Any] | None = None, *, desktops: int = 1
) -> BackendSupport:
    """:class:`BackendSupport` of ``backend`` with desktop ``options`` on this host, for
    ``desktops`` desktops open at once (collect's runners + spares): the backend's own
    ``support`` (:class:`.registry.BackendSpec`). Every backend's includes the file cache of
    option ``cache_dir``, by default ``legato osworld cache``'s directory
    (``osworld_format.sources.file_cache_dir``). The options are checked against the
    backend's options model first (:func:`.registry.check_options`), so collect's preflight
    and ``legato tasks check`` refuse the same options before anything is written. Raises
    ``ConfigError`` for an unknown backend, or a bad option naming the option and the fix.
    """
    check_options(backend, options)
    return get(backend).support(dict(options or {}), desktops)
