"""What a backend offers on this host, for the one task verdict (``osworld_format.verdict``).

``legato tasks check --backend X`` and the engine's preflight both call
:func:`backend_support` and then :func:`~legato_pipelines.osworld_format.verdict.preflight`,
so a task the check refuses never starts and one it accepts never fails for a reason either
could have known: apps the local desktops lack, pyautogui on them, the internet vs. the file
cache, and names (setup step types, metrics, getters) against the grader the run will use:
OSWorld's own (the installed desktop-env's lists) or the project's own subset.
"""

from __future__ import annotations

import functools
from typing import Any

from ..osworld_format.classify import BackendSupport
from ..osworld_format.sources import file_cache_dir


@functools.lru_cache(maxsize=1)
def _host_local() -> tuple[frozenset[str], bool]:
    from .server.apps import desktop_python_has_pyautogui, installed_apps

    return installed_apps(), desktop_python_has_pyautogui()


def backend_support(
    backend: str, options: dict[str, Any] | None = None, *, desktops: int = 1
) -> BackendSupport:
    """:class:`BackendSupport` of ``backend`` with desktop ``options`` on this host, for
    ``desktops`` desktops open at once (collect's runners + spares).

    ``local``: this host's apps and pyautogui (probed once per process; desktops attached by
    ``urls`` run elsewhere, so no app is held against a task there), the grader of option
    ``grader`` (``desktops/osworld_worker/grader.py``: OSWorld's names when its venv is installed),
    option ``network`` (``auto`` by default; not known for ``urls``, whose servers chose
    theirs) which with ``desktops`` decides the tasks reaching Chrome's or VLC's port
    (``osworld_format/ports.py``) and, with options ``proxy`` and ``web_probe``, whether the
    desktops reach outside (``desktops/web.py``: the reachability check runs once per
    process); ``osworld``: the installed desktop-env's names when its
    interpreter exists; every backend: the file cache of option ``cache_dir``, by default
    ``legato osworld cache``'s directory (``osworld_format.sources.file_cache_dir``).
    Raises ``ConfigError`` for a bad ``grader``, ``cache_dir``, ``sandbox``, ``network`` or
    (local) ``prebuild``, ``base_port``, ``start_timeout``, ``limits`` or ``proxy`` option,
    naming the option and its allowed values.
    """
    from .network import sandbox_options
    from .osworld_worker import installed_grader, local_grader, osworld_python
    from .server.apps import DESKTOP_APPS
    from .server.desktop import limits_option, prebuild_option, server_numbers
    from .web import route_out, web_settings

    options = dict(options or {})
    fields: dict[str, Any] = {"cache_dir": file_cache_dir(options)}
    network = "auto"
    if backend in ("local", "osworld") and {"sandbox", "network"} & options.keys():
        _, network = sandbox_options(options)  # osworld: its provider local's servers
    if backend == "local":
        prebuild_option(options.get("prebuild"))  # checked before anything is written
        server_numbers(options)
        limits_option(options.get("limits", True))
        fields["local_network"] = None if options.get("urls") else network
        fields["local_desktops"] = max(1, desktops)
        if options.get("urls"):
            every = {app.provides for app in DESKTOP_APPS} | {"os", "libreoffice"}
            fields["local_apps"], fields["local_pyautogui"] = frozenset(every), True
        else:
            fields["local_apps"], fields["local_pyautogui"] = _host_local()
        fields["local_grader"] = local_grader(options)[0]
        web = web_settings(options)
        fields["local_proxy"] = web.proxy is not None
        if web.mode == "replay":
            fields["local_web_archive"] = web.archive
        fields["local_route_out"], fields["local_route_why"] = route_out(
            fields["local_network"], web
        )
    elif backend == "osworld":
        python = osworld_python(options)
        if python is not None:
            fields["osworld_grader"] = installed_grader(str(python))
    return BackendSupport(**fields)
