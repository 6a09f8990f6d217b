"""``DesktopPoolResource``: which desktops a batch runs on, and how many.

One resource for the three backends of the desktop protocol (``fake``: no VMs, the mock
transport; ``local``: Xvfb desktops on this host; ``osworld``: OSWorld's DesktopEnv), chosen
by ``backend``; backend-specific knobs go in ``options`` (see each backend's module). The
engine starts and closes the desktops within the run.

Desktops on other hosts (``local`` backend): ``urls`` lists desktop servers (``legato desktop
serve`` on desktop hosts, http://HOST:PORT) that the run attaches to, health-checked before
the batch and before every attempt (:mod:`legato_pipelines.desktops.server.remote`); ``desktops``
then counts the desktops started on the run's own host besides them (0 on a worker without a
display). Their token is read from ``token_env`` in the run's environment, never from config.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field
from pydantic.fields import FieldInfo

from ..desktops.base import DesktopConfig
from ..desktops.registry import capabilities
from ..desktops.server.wire import DEFAULT_TOKEN_ENV
from ..errors import ConfigError


def _desktop_field(name: str, description: str) -> Any:
    """The :class:`DesktopConfig` field ``name`` (its default and bounds: one definition), with
    the launchpad's ``description``."""
    return FieldInfo.merge_field_infos(DesktopConfig.model_fields[name], description=description)


class DesktopPoolResource(dg.ConfigurableResource):
    """Fields: ``backend`` (a registered backend, :mod:`..desktops.registry`; LEGATO_BACKEND), ``desktops`` (how many at
    once; LEGATO_DESKTOPS), ``screen_width``/``screen_height`` [pixels], ``eval_timeout`` [s]
    per evaluation, ``options`` (backend-specific), ``osworld`` (an OSWorld checkout, needed by
    task lists that name OSWorld tasks by domain and id)."""

    backend: str = _desktop_field(
        "backend", "Desktop backend, a registered one (LEGATO_BACKEND; docs/backends.md)."
    )
    # No ge=1 here: an EnvVar.int placeholder is validated as 0; the engine checks the count.
    desktops: int = Field(
        default=4,
        description="Desktops run at once; with urls, those started here besides them (LEGATO_DESKTOPS).",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Desktop server URLs on other hosts, backend local (LEGATO_DESKTOP_URLS).",
    )
    token_env: str = Field(
        default=DEFAULT_TOKEN_ENV, description="Variable holding the token of the servers at urls."
    )
    # None: the engine's default for the task set (desktops/task_defaults.py: OSWorld's
    # tasks get the VM's 1920x1080), else DesktopConfig's
    screen_width: int | None = Field(
        default=None,
        description="Pixels; unset: 1920 for OSWorld task sets, else DesktopConfig's default.",
    )
    screen_height: int | None = Field(
        default=None,
        description="Pixels; unset: 1080 for OSWorld task sets, else DesktopConfig's default.",
    )
    eval_timeout: float = _desktop_field("eval_timeout", "Seconds an evaluation may take.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Backend-specific options, and the named waits (ready_after_action_s, ...) (LEGATO_BACKEND_OPTIONS, JSON).",
    )
    osworld: str | None = Field(
        default=None, description="OSWorld checkout for domain/id task lists (LEGATO_OSWORLD)."
    )

    def count(self) -> int:
        """Desktops a batch runs at once: ``desktops`` plus the ``urls``. Raises ``ConfigError``
        when ``urls`` is set for a backend other than ``local`` (the engine rejects a count < 1)."""
        if self.urls and not capabilities(self.backend).attaches_urls:
            raise ConfigError(
                f"desktops.urls: backend {self.backend!r} does not attach desktop servers by URL"
                " (fix: LEGATO_BACKEND set to a backend that does, e.g. local)"
            )
        return self.desktops + len(self.urls)

    def config(self) -> DesktopConfig:
        """The engine's :class:`DesktopConfig` (the run's wait and reset knobs are passed to
        ``collect`` separately and override its defaults)."""
        options = dict(self.options)
        if self.urls:
            options.update(urls=list(self.urls), token_env=self.token_env, local=self.desktops)
        screen = {
            name: value
            for name, value in (
                ("screen_width", self.screen_width),
                ("screen_height", self.screen_height),
            )
            if value is not None  # unset: task_defaults.for_tasks may fill it in
        }
        return DesktopConfig(
            backend=self.backend, eval_timeout=self.eval_timeout, options=options, **screen
        )
