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
_LAZY = {name: ".base" for name in ("Desktop", "DesktopConfig", "Evaluation", "Wait", "Waits")}

if TYPE_CHECKING:
    from .base import Desktop, DesktopConfig, Evaluation, Wait, Waits

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = [
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
    and keeps it for the batch): the backend's ``warm_up`` (:class:`.registry.BackendSpec`;
    the local backend's: the templates its desktop servers and OSWorld graders are forked
    from), nothing for a backend without one. ``evaluators``: the batch's tasks' evaluator
    objects (OSWorld format), whose metric and getter modules the graders' template imports
    before it forks the workers. Raises ``ConfigError`` when an option names what is not there
    (as opening the desktops would)."""
    from .registry import check_options, get

    spec = get(config.backend)
    check_options(config.backend, config.options)  # the registry's one check, first
    if spec.warm_up is None:
        return contextlib.nullcontext()
    return spec.warm_up(config, evaluators)


async def open_desktops(config: DesktopConfig, n: int, first: int = 0) -> list[Desktop]:
    """Start (or attach to) ``n`` desktops of ``config.backend`` (its opener in the registry,
    :mod:`.registry`); raise ``ConfigError`` for a backend that is not available here,
    ``DesktopError`` when desktops fail to start.

    ``first``: the number in the first desktop's name (``<backend>-<first>``), for desktops
    opened after others of the same batch (spares that join late); only backends whose
    capabilities say ``opens_late`` take it (``ConfigError`` otherwise). The first call of a
    batch (``first`` 0) of a backend whose desktops leave scratch directories
    (``Capabilities.scratch``) removes the temp folder's directories that killed legato
    processes left (:func:`.scratch.sweep`). ``config.options`` are checked against the
    backend's options model first (:func:`.registry.check_options`: ``ConfigError`` naming
    the option, the backend and the fix), before its opener runs."""
    from .registry import check_options, get

    spec = get(config.backend)
    check_options(config.backend, config.options)
    capabilities = spec.capabilities(config.options)
    if first and not capabilities.opens_late:
        raise ConfigError(
            f"desktops: only desktops started here by a backend that opens late can be opened "
            f"late (backend {config.backend!r}, first={first})"
        )
    if n < 1:
        raise ConfigError(f"desktops: need at least 1 desktop, got {n} (fix: --desktops N)")
    if (
        first == 0 and capabilities.scratch
    ):  # a batch's first desktops: clear what killed processes left
        from ..scratch import sweep

        await asyncio.to_thread(sweep)
    return list(await spec.open(config, n, first))
