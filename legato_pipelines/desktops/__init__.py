"""Desktop backends behind one protocol (:class:`Desktop`), and the factory the engine uses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..lazy import lazy_getattr

#: Names imported on first use (PEP 562): a desktop server imports this package on its way
#: to ``.local.server`` and needs none of the client side's protocol (``.base`` pulls in the
#: harness and the OSWorld task format).
_LAZY = {
    name: ".base" for name in ("Backend", "Desktop", "DesktopConfig", "Evaluation", "Wait", "Waits")
}

if TYPE_CHECKING:
    from .base import Backend, Desktop, DesktopConfig, Evaluation, Wait, Waits

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = [
    "Backend",
    "Desktop",
    "DesktopConfig",
    "Evaluation",
    "Wait",
    "Waits",
    "open_desktops",
    "warm_up",
]


def warm_up(
    config: DesktopConfig, evaluators: Sequence[dict] = ()
) -> contextlib.AbstractAsyncContextManager:
    """What every desktop of a batch on ``config`` shares, started when the block is entered
    so that it is ready when the desktops open (the engine enters it before its policy check
    and keeps it for the batch): the templates the ``local`` backend's desktop servers and
    OSWorld graders are forked from (``server/template.py``, ``osworld_worker/template.py``);
    nothing for the other backends. ``evaluators``: the batch's tasks' evaluator objects
    (OSWorld format), whose metric and getter modules the graders' template imports before
    it forks the workers. Raises
    ``ConfigError`` when the local desktops' option ``grader``/``osworld_python`` names what is
    not there (as opening them would)."""
    if config.backend == "local":
        from .server.desktop import warm_up_local

        return warm_up_local(config, evaluators)
    return contextlib.nullcontext()


async def open_desktops(config: DesktopConfig, n: int, first: int = 0) -> list[Desktop]:
    """Start (or attach to) ``n`` desktops of ``config.backend``; raise ``ConfigError`` for a
    backend that is not available here, ``DesktopError`` when desktops fail to start.

    ``first``: the number in the first desktop's name (``local-<first>``, ``fake-<first>``),
    for desktops opened after others of the same batch (spares that join late); only the
    ``fake`` and ``local`` backends starting their own desktops take it (``ConfigError``
    otherwise). A cancelled opening of ``local`` desktops stops what it started. The first
    call of a batch (``first`` 0; not for ``fake``) removes the temp folder's directories that
    killed legato processes left (:func:`.scratch.sweep`)."""
    if first and (config.backend not in ("fake", "local") or config.options.get("urls")):
        raise ConfigError(
            f"desktops: only fake and local desktops started here can be opened late (first={first})"
        )
    if n < 1:
        raise ConfigError(f"desktops: need at least 1 desktop, got {n} (fix: --desktops N)")
    if config.backend == "fake":
        from .backends.fake import FakeDesktop

        return [FakeDesktop(config, i) for i in range(first, first + n)]
    if first == 0:  # a batch's first desktops: clear what killed processes left (scratch.py)
        from ..scratch import sweep

        await asyncio.to_thread(sweep)
    if config.backend == "local":
        try:
            from .server.desktop import open_local_desktops
            from .server.remote import open_remote_pool
        except ImportError as exc:
            raise ConfigError(f"backend 'local' is not available: {exc}") from None
        if config.options.get("urls"):  # servers on other hosts, health-checked (remote.py)
            return list(await open_remote_pool(config, n))
        return list(await open_local_desktops(config, n, first))
    if config.backend == "osworld":
        try:
            from .osworld_worker.desktop import open_osworld_desktops
        except ImportError:
            raise ConfigError(
                "backend 'osworld' is not available yet in this build (fix: --backend local or --backend fake)"
            ) from None
        return list(await open_osworld_desktops(config, n))
    raise ConfigError(f"desktop.backend: unknown backend {config.backend!r} (fake, local, osworld)")
