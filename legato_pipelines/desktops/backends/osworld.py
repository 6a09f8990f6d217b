"""The ``osworld`` backend: OSWorld's ``DesktopEnv`` in a worker process per desktop, under its
own interpreter (``desktops/osworld_worker``: the worker, its channel, the desktop driving
it). The options below are documented at length in ``desktops/osworld_worker/desktop.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...errors import ConfigError
from ..registry import BackendSpec, Capabilities, register


class OSWorldOptions(BaseModel):
    """The osworld backend's options (``--desktop-option KEY=VALUE``), typed (a wrong type is a
    ``ConfigError`` naming the option when the desktops open). ``provider``,
    ``ready`` and ``fast_mode`` are checked together by
    :func:`~legato_pipelines.desktops.osworld_worker.options.plan_desktops` (errors naming
    the option and the fix); the DesktopEnv arguments are passed on as they are."""

    model_config = ConfigDict(extra="forbid")

    osworld_python: str | Path | None = Field(None, description="interpreter with desktop-env")
    provider: str | None = Field(None, description="docker (default) | local | vmware | aws | ...")
    path_to_vm: str | None = Field(None, description="DesktopEnv's path_to_vm")
    region: str | None = Field(None, description="DesktopEnv's region")
    snapshot_name: str | None = Field(None, description="DesktopEnv's snapshot_name")
    os_type: str | None = Field(None, description="DesktopEnv's os_type")
    client_password: str | None = Field(None, description="DesktopEnv's client_password")
    headless: bool | None = Field(None, description="DesktopEnv's headless (default true)")
    enable_proxy: bool | None = Field(None, description="DesktopEnv's enable_proxy")
    cache_dir: str | Path | None = Field(
        None, description="root of the per-desktop DesktopEnv cache dirs"
    )
    work_dir: str | Path | None = Field(None, description="the workers' working directory and logs")
    ready: str | None = Field(None, description="screenshot (default) | server (provider local)")
    fast_mode: str | None = Field(None, description="vm | server (provider local)")
    start_timeout: float | None = Field(
        None, description="seconds a worker may take to start its VM"
    )
    call_timeout: float | None = Field(None, description="seconds for observe/act")
    reset_timeout: float | None = Field(
        None, description="seconds for a reset with the task's setup"
    )
    user: Any = Field(None, description="provider local: the desktop servers' user")
    template: str | Path | None = Field(
        None, description="provider local: the desktops' HOME template"
    )
    sandbox: Any = Field(None, description="provider local: the desktop servers' sandbox")
    network: Any = Field(None, description="provider local: auto | host | none | own")
    log_level: str | None = Field(None, description="the worker's logging level (default WARNING)")


async def _open(config, n: int, first: int = 0) -> list:
    """Start ``n`` DesktopEnv workers. Raises ``ConfigError`` for bad options, a missing
    interpreter, or when the worker's side is missing from this build."""
    try:
        from ..osworld_worker.desktop import open_osworld_desktops
    except ImportError:
        raise ConfigError(
            f"backend {SPEC.name!r} is not available yet in this build (fix: another --backend)"
        ) from None
    return list(await open_osworld_desktops(config, n))


def _capabilities(options: Mapping[str, Any]) -> Capabilities:
    from ..osworld_worker.options import runs_desktop_servers

    return Capabilities(chooses_network=runs_desktop_servers(options), task_checks="osworld")


def _support(options: Mapping[str, Any], desktops: int = 1):
    """The installed desktop-env's names when its interpreter exists (else names are checked
    when a task resets) and the file cache of option ``cache_dir``. Raises ``ConfigError`` for
    a bad ``cache_dir``, ``sandbox`` or ``network`` option."""
    from ...osworld_format.classify import BackendSupport
    from ...osworld_format.sources import file_cache_dir
    from ..network import sandbox_options
    from ..osworld_worker import installed_grader, osworld_python

    options = dict(options)
    fields: dict[str, Any] = {"cache_dir": file_cache_dir(options)}
    if {"sandbox", "network"} & options.keys():
        sandbox_options(options)  # its provider local's servers
    python = osworld_python(options)
    if python is not None:
        fields["osworld_grader"] = installed_grader(str(python))
    return BackendSupport(**fields)


SPEC = register(
    BackendSpec(
        name="osworld",
        summary="OSWorld's DesktopEnv (VMs, or a desktop server with provider local)",
        open=_open,
        options=OSWorldOptions,
        capabilities=_capabilities,
        support=_support,
        grader_kind=lambda support: "osworld",
    )
)
