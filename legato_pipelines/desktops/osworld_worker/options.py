"""The ``osworld`` backend's options: validated once, turned into each worker's ``start``
request, its interpreter and its clean environment (see :mod:`.backend` for the option list).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Any

from ...errors import ConfigError
from ...user_cache import legato_cache
from ..base import DesktopConfig, check_options
from ..child_env import PASS_ENV, worker_env  # noqa: F401 - the workers' environment
from .install import default_venv, venv_python

PROVIDERS = ("docker", "local", "vmware", "virtualbox", "aws", "azure", "aliyun", "volcengine")
#: The HOME baseline of a local desktop in ``fast_mode`` ``vm`` (expanded by the desktop's shell).
LOCAL_VM_BASELINE = "$TMPDIR/legato-home-baseline"


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/legato/osworld-cache`` (``~/.cache/...``): DesktopEnv cache dirs."""
    return legato_cache("osworld-cache")


def claim_cache_dir(cache_dir: str | Path) -> IO[str]:
    """Hold desktop folder ``cache_dir`` (``<root>/desktop-<i>``, DesktopEnv's cache of one
    desktop) for this process: an exclusive ``flock`` on ``<root>/desktop-<i>.lock``, kept
    until the returned file is closed (or the process ends). Two batches on one host with the
    same ``cache_dir`` option would otherwise give their desktop ``i`` the same folder, where
    DesktopEnv downloads and getters write a task's files. Raises ``ConfigError`` naming the
    folder, the holder's pid and the fix when another process holds it."""
    folder = Path(cache_dir)
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = open(folder.with_name(folder.name + ".lock"), "a+")  # noqa: SIM115 - kept open
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise ConfigError(
            f"desktop option cache_dir: {folder} is in use by another batch on this host (pid "
            f"{holder}); each desktop needs a folder of its own (fix: give each batch running "
            "at once its own --desktop-option cache_dir=DIR)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def runs_desktop_servers(options: Any) -> bool:
    """Whether desktops of ``options`` run project desktop servers here as their "VM"
    (provider ``local``), whose sandbox and network the server options choose."""
    return options.get("provider") == "local"


def _start_request(
    config: DesktopConfig, opts: dict[str, Any], provider: str, cache_dir: Path
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "provider": provider,
        "screen": [config.screen_width, config.screen_height],
        "cache_dir": str(cache_dir),
        "headless": bool(opts.get("headless", True)),
    }
    for key in (
        "path_to_vm",
        "region",
        "snapshot_name",
        "os_type",
        "client_password",
        "enable_proxy",
    ):
        if opts.get(key) is not None:
            request[key] = opts[key]
    return request


def resolve_python(config: DesktopConfig) -> str:
    """The OSWorld interpreter: option ``osworld_python`` or the default venv's python.

    Raises ``ConfigError`` naming the fix when it does not exist.
    """
    given = config.options.get("osworld_python")
    python = Path(given).expanduser() if given else venv_python(default_venv())
    if not python.exists():
        where = "--osworld-python" if given else f"the default venv {default_venv()}"
        raise ConfigError(
            f"osworld backend: no OSWorld interpreter at {python} ({where}); "
            "fix: `legato osworld install` or --osworld-python PATH"
        )
    return str(python)


def plan_desktops(config: DesktopConfig, n: int) -> list[dict[str, Any]]:
    """Validate ``config`` for the osworld backend; the ``start`` request of each of ``n`` desktops.

    Raises ``ConfigError`` for unknown options, an unknown provider, or ``ready="server"``
    without provider ``local``.
    """
    options = check_options(config).model_dump(exclude_none=True)  # typed (backends/osworld.py)
    if n < 1:
        raise ConfigError(f"desktops must be >= 1, got {n}")
    provider = str(options.get("provider") or "docker").lower()
    if provider not in PROVIDERS:
        raise ConfigError(
            f"desktop option provider={provider!r} is unknown; use one of {list(PROVIDERS)} (--osworld-provider)"
        )
    ready = options.get("ready", "screenshot")
    if ready not in ("screenshot", "server") or (ready == "server" and provider != "local"):
        raise ConfigError(
            f"desktop option ready={ready!r}: use 'screenshot', or 'server' with provider 'local'"
        )
    fast_mode = options.get("fast_mode", "server" if provider == "local" else "vm")
    if fast_mode not in ("vm", "server") or (fast_mode == "server" and provider != "local"):
        raise ConfigError(
            f"desktop option fast_mode={fast_mode!r}: use 'vm', or 'server' with provider 'local'"
        )
    root = Path(options.get("cache_dir") or default_cache_root()).expanduser().resolve()
    requests = [_start_request(config, options, provider, root / f"desktop-{i}") for i in range(n)]
    for request in requests:
        request["fast_mode"] = fast_mode
        if provider == "local" and fast_mode == "vm":
            # several local desktops share one user: each keeps its baseline in its own TMPDIR
            request["baseline_dir"] = LOCAL_VM_BASELINE
    return requests
