"""Which network a batch's sandboxed local desktops get (desktop option ``network``).

A policy is an optimizer: whatever its desktop reaches, it eventually uses. On the host's
network a desktop reaches every loopback service of the host (the model server, Dagster's
webserver, Postgres, Redis...), so the default never is the host's (issue 30, item 6;
docs/sandbox.md §1):

- ``auto`` (the default): ``none`` (a loopback of its own) when no task of the batch needs a
  network, else ``own`` (a network namespace of its own, connected by passt's ``pasta``: a
  route out and OSWorld's Chrome and VLC ports forwarded from per-desktop host ports, but
  nothing of the host's loopback). A task needs one when :func:`task_needs_network` says so:
  it fetches from the internet (``osworld_format.classify``: downloads not in the file cache,
  live websites, package installs, Google accounts, a proxy) or its setup or grader reaches
  the desktop's Chrome or VLC port from outside (``osworld_format.ports``).
- ``host``, ``none``, ``own``: as asked. ``host`` is logged as a warning and recorded in the
  run's ``run.json`` (``knobs.network_warning``).

A desktop's network is fixed when its sandbox starts, so it is decided once per batch,
before any desktop opens (:func:`resolve_network`). Unsandboxed desktops (``sandbox=false``)
run on the host's network: there is nothing to choose.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..tasks import Task
from .base import DesktopConfig

log = logging.getLogger("legato_pipelines.desktops.network")

AUTO = "auto"
#: The desktop option's values (``legato desktop serve --network`` takes the last three).
CHOICES = (AUTO, "host", "none", "own")
#: The warning a batch on the host's network logs and records.
HOST_WARNING = (
    "desktop option network=host: the desktops' processes (whatever the policy starts, sudo"
    " included) share this host's network and reach every service on its loopback (the model"
    " server, Dagster, databases); use the default network=auto (none, or own for tasks"
    " needing a network) unless the tasks need the host's services"
)
PASTA = "pasta"


def task_needs_network(task: Task, *, cache_dir: Any = None) -> list[str]:
    """Why ``task`` needs a network beyond its desktop's own loopback (empty: it does not):
    URLs and reasons it would fetch from the internet (the file cache ``cache_dir`` serving
    none of them), and its setup steps or getters reaching the desktop's Chrome or VLC port
    from outside (OSWorld's ``chromium_port``/``vlc_port``)."""
    from ..osworld_format.classify import BackendSupport, classify_task

    found = classify_task(task, backend_support=BackendSupport(cache_dir=cache_dir))
    return [*found.internet_urls, *found.internet_reasons, *found.port_parts]


def applies(desktop: DesktopConfig) -> bool:
    """True when ``desktop`` starts sandboxed desktop servers here, whose network this module
    chooses: the backend's capability ``chooses_network`` (:mod:`.registry`; the local
    backend without ``urls``, whose attached servers chose theirs, or osworld with provider
    ``local``)."""
    from .registry import capabilities

    return capabilities(desktop.backend, desktop.options).chooses_network


def resolve_network(
    desktop: DesktopConfig, tasks: Sequence[Task]
) -> tuple[DesktopConfig, dict[str, str]]:
    """``desktop`` with option ``network`` decided for a batch of ``tasks``, and what to record
    in ``run.json``'s knobs: ``{"network": ...}`` (plus ``network_warning`` for ``host``);
    ``desktop`` unchanged and ``{}`` where no network is chosen here (:func:`applies`).

    ``auto`` (or no option) becomes ``own`` when a task needs a network
    (:func:`task_needs_network`; logged with the first tasks' reasons), else ``none``.
    Raises ``ConfigError`` for a bad ``network``/``sandbox`` option, and when ``own`` is
    needed but ``pasta`` is not installed (naming the tasks and the fixes)."""
    if not applies(desktop):
        return desktop, {}
    sandbox, network = sandbox_options(desktop.options)
    if not sandbox:
        return desktop, {"network": "host"}
    if network == AUTO:
        from ..osworld_format.sources import file_cache_dir

        cache_dir = file_cache_dir(desktop.options)
        needing = {}
        for task in tasks:
            reasons = task_needs_network(task, cache_dir=cache_dir)
            if reasons:
                needing[task.task_id] = reasons
        network = "own" if needing else "none"
        if needing and shutil.which(PASTA) is None:
            shown = ", ".join(f"{t} ({r[0]})" for t, r in list(needing.items())[:3])
            raise ConfigError(
                f"{len(needing)} task(s) need a network ({shown}): the default desktop option"
                " network=auto gives their desktops one of their own through pasta, which is"
                " not installed (fix: apt-get install passt; or drop those tasks; or"
                " --desktop-option network=host, which reaches this host's loopback services)"
            )
        if needing:
            first = next(iter(needing.items()))
            log.info(
                "desktop network own (auto): %d task(s) need a network, e.g. %s: %s",
                len(needing),
                first[0],
                first[1][0],
            )
    record = {"network": network}
    if network == "host":
        log.warning(HOST_WARNING)
        record["network_warning"] = HOST_WARNING
    options = {**desktop.options, "network": network}
    return desktop.model_copy(update={"options": options}), record


def sandbox_options(options: dict[str, Any]) -> tuple[bool, str]:
    """``(sandbox, network)`` from desktop options ``sandbox`` (default true) and ``network``
    (``"auto"``, the default: decided per batch by :func:`..network.resolve_network`;
    ``"host"``, ``"none"`` or ``"own"``). Unsandboxed, the network is the host's (``auto``
    becomes ``"host"``). Raises ``ConfigError`` naming the option."""
    sandbox, network = options.get("sandbox", True), options.get("network", AUTO)
    if not isinstance(sandbox, bool):
        raise ConfigError(f"desktop option 'sandbox' must be true or false, got {sandbox!r}")
    if network not in CHOICES:
        raise ConfigError(
            f"desktop option 'network' must be one of {', '.join(CHOICES)}, got {network!r}"
        )
    if not sandbox:
        if network not in (AUTO, "host"):
            raise ConfigError(f"desktop option network={network} needs the sandbox (sandbox=true)")
        return sandbox, "host"
    return sandbox, network


def server_network(network: str) -> str:
    """The ``--network`` of a server started for desktop option ``network``: ``auto`` that no
    batch decided (desktops opened without their tasks; a batch decides before it opens any,
    :func:`..network.resolve_network`) is ``none``, the least the desktop can reach."""
    return "none" if network == "auto" else network
