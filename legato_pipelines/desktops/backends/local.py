"""The ``local`` backend: real X11 desktops on Xvfb, one desktop server process each
(``desktops/server``), started on this host or attached by URL (option ``urls``), graded by
OSWorld's own code in an attached worker (``desktops/osworld_worker``) or the project's own
subset (option ``grader``). See docs/local-desktop.md for the options' meaning.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...errors import ConfigError
from ..registry import BackendSpec, Capabilities, register


class LocalOptions(BaseModel):
    """The local backend's options (``--desktop-option KEY=VALUE``). Values with a rule of their
    own (``sandbox``, ``network``, ``limits``, ``prebuild``, ``base_port``, ``start_timeout``,
    ``grader``, ``session``) are checked where they are used, with errors naming the option and the fix
    (:func:`_support` runs those checks in the preflight)."""

    model_config = ConfigDict(extra="forbid")

    urls: list[str] | None = Field(None, description="desktop servers on other hosts, by URL")
    token_env: str | None = Field(None, description="variable holding the servers' token")
    local: int | None = Field(None, description="with urls: desktops started here besides them")
    reconnect_s: float | None = Field(None, description="with urls: seconds to wait for a server")
    base_port: Any = Field(None, description="the n-th server listens on base_port + n")
    host: str | None = Field(None, description="address the servers listen on")
    user: Any = Field(None, description="user the desktop's apps run as")
    sandbox: Any = Field(None, description="run each desktop in a sandbox (default: on)")
    network: Any = Field(None, description="auto | host | none | own")
    limits: Any = Field(None, description="resource caps of a desktop (true, false or caps)")
    template: str | Path | None = Field(None, description="HOME template directory of the desktops")
    prebuild: Any = Field(None, description="apps whose profile the baseline HOME holds")
    cache_dir: str | Path | None = Field(None, description="file cache of the tasks' downloads")
    start_timeout: Any = Field(None, description="seconds a server may take to come up")
    grader: Any = Field(None, description="auto | osworld | own")
    osworld_python: str | Path | None = Field(
        None, description="interpreter with desktop-env (grader osworld)"
    )
    proxy: Any = Field(None, description="proxy the desktops' browser uses (LEGATO_PROXY)")
    web_probe: Any = Field(None, description="HOST:PORT the route-out check reaches")
    web: Any = Field(None, description="live | record:ARCHIVE | replay:ARCHIVE")
    web_hosts: Any = Field(None, description="{name: 'addr[:port]'}: sites served elsewhere")
    web_ca: Any = Field(None, description="PEM files of CAs the browser and recorder trust")
    session: Any = Field(None, description="plain | vm: openbox on black, or the VM's look")


async def _open(config, n: int, first: int = 0) -> list:
    """Start ``n`` desktop servers here (named ``local-<first>`` on), or attach to option
    ``urls`` (health-checked, ``desktops/server/remote.py``). Raises ``ConfigError`` for bad
    options or when the server's modules are missing here."""
    SPEC.check_options(config.options)
    try:
        from ..server.desktop import open_local_desktops
        from ..server.remote import open_remote_pool
    except ImportError as exc:
        raise ConfigError(f"backend {SPEC.name!r} is not available: {exc}") from None
    if config.options.get("urls"):  # servers on other hosts
        return list(await open_remote_pool(config, n))
    return list(await open_local_desktops(config, n, first))


def _warm_up(config, evaluators: Sequence[dict] = ()):
    from ..server.desktop import warm_up_local

    return warm_up_local(config, evaluators)


def _capabilities(options: Mapping[str, Any]) -> Capabilities:
    here = not options.get("urls")  # started on this host (not attached by URL)
    return Capabilities(
        opens_late=here,
        default_spares=here,
        attaches_urls=True,
        chooses_network=here,
        task_checks="local",
    )


@functools.lru_cache(maxsize=1)
def _host_local() -> tuple[frozenset[str], bool]:
    from ..server.apps import desktop_python_has_pyautogui, installed_apps

    return installed_apps(), desktop_python_has_pyautogui()


def _support(options: Mapping[str, Any], desktops: int = 1):
    """What local desktops offer here: this host's apps and pyautogui (probed once per
    process; desktops attached by ``urls`` run elsewhere, so no app is held against a task
    there), the grader of option ``grader`` (``osworld_worker/grader.py``: OSWorld's names
    when its venv is installed), option ``network`` (``auto`` by default; not known for
    ``urls``, whose servers chose theirs) which with ``desktops`` decides the tasks reaching
    Chrome's or VLC's port (``osworld_format/ports.py``) and, with options ``proxy`` and
    ``web_probe``, whether the desktops reach outside (``desktops/web.py``: the reachability
    check runs once per process), and the file cache of option ``cache_dir``. Raises
    ``ConfigError`` for a bad ``grader``, ``cache_dir``, ``sandbox``, ``network``,
    ``prebuild``, ``base_port``, ``start_timeout``, ``limits``, ``session`` or ``proxy`` option."""
    from ...osworld_format.classify import BackendSupport
    from ...osworld_format.sources import file_cache_dir
    from ..network import sandbox_options
    from ..osworld_worker import local_grader
    from ..server.apps import DESKTOP_APPS
    from ..server.desktop import limits_option, prebuild_option, server_numbers, session_option
    from ..web import route_out, web_settings

    options = dict(options)
    fields: dict[str, Any] = {"cache_dir": file_cache_dir(options)}
    network = "auto"
    if {"sandbox", "network"} & options.keys():
        _, network = sandbox_options(options)
    prebuild_option(options.get("prebuild"))  # checked before anything is written
    if not options.get("urls"):
        session_option(options.get("session"))
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
    fields["local_route_out"], fields["local_route_why"] = route_out(fields["local_network"], web)
    return BackendSupport(**fields)


SPEC = register(
    BackendSpec(
        name="local",
        summary="real X11 desktops on Xvfb, a desktop server each (here or by URL)",
        open=_open,
        options=LocalOptions,
        capabilities=_capabilities,
        support=_support,
        grader_kind=lambda support: support.local_grader.kind,
        warm_up=_warm_up,
    )
)
