"""Desktop backends behind one protocol (:class:`Desktop`), and the factory the engine uses."""

from __future__ import annotations

from ..errors import ConfigError
from .base import Backend, Desktop, DesktopConfig, Evaluation, Wait, Waits

__all__ = ["Backend", "Desktop", "DesktopConfig", "Evaluation", "Wait", "Waits", "open_desktops"]


async def open_desktops(config: DesktopConfig, n: int) -> list[Desktop]:
    """Start (or attach to) ``n`` desktops of ``config.backend``; raise ``ConfigError`` for a
    backend that is not available here, ``DesktopError`` when desktops fail to start."""
    if n < 1:
        raise ConfigError(f"desktops: need at least 1 desktop, got {n} (fix: --desktops N)")
    if config.backend == "fake":
        from .fake import FakeDesktop

        return [FakeDesktop(config, i) for i in range(n)]
    if config.backend == "local":
        try:
            from .local.backend import open_local_desktops
            from .remote import open_remote_pool
        except ImportError as exc:
            raise ConfigError(f"backend 'local' is not available: {exc}") from None
        if config.options.get("urls"):  # servers on other hosts, health-checked (remote.py)
            return list(await open_remote_pool(config, n))
        return list(await open_local_desktops(config, n))
    if config.backend == "osworld":
        try:
            from .osworld.backend import open_osworld_desktops
        except ImportError:
            raise ConfigError(
                "backend 'osworld' is not available yet in this build (fix: --backend local or --backend fake)"
            ) from None
        return list(await open_osworld_desktops(config, n))
    raise ConfigError(f"desktop.backend: unknown backend {config.backend!r} (fake, local, osworld)")
