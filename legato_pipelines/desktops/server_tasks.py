"""OSWorld-format tasks on a desktop driven through its server's base API.

The ``local`` backend and OSWorld VM servers attached by URL (:mod:`.vmserver`) run a task the
same way, on the collector's side: the task's setup steps after the reset, its evaluator
(postconfig, getters, metrics) within ``eval_timeout``, with a per-attempt work directory
for what setup captures and evaluation fetches (:mod:`legato_pipelines.osworld_format`).
"""

from __future__ import annotations

import shutil
from typing import Any

from ..osworld_format import evaluate_task_within, run_setup
from ..osworld_format.sources import file_cache_dir
from ..scratch import scratch_dir
from ..tasks import Evaluation, Task
from .base import DesktopConfig
from .client import DesktopClient


class ServerTasks:
    """Base of a desktop named ``name`` driven through ``client`` (OSWorld's base API), with
    its ``config`` and ``screen_size`` (pixels). ``cache_dir`` (option): the read-only file
    cache for downloads. ``__repr__`` names the class, the desktop and the server's URL.

    ``setup_failures``: the facts of the last setup (steps OSWorld carries on after, see
    :func:`~legato_pipelines.osworld_format.run_setup`), which the engine records on the
    attempt (``reset.setup_failures``)."""

    def __init__(
        self, name: str, client: DesktopClient, config: DesktopConfig, screen_size: tuple[int, int]
    ):
        self.name = name
        self.client = client
        self.config = config
        self.screen_size = screen_size
        self._work_dir: str | None = None
        self.setup_failures: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.client.url!r})"

    async def _run_task_setup(self, task: Task) -> None:
        """The task's setup steps in a fresh work directory (raises ``DesktopError``); what
        OSWorld carries on after lands in :attr:`setup_failures`."""
        self._new_work_dir()
        self.setup_failures = []
        self.setup_failures = await run_setup(
            task,
            self.client,
            cache_dir=file_cache_dir(self.config.options),
            work_dir=self._work_dir,
            screen_size=self.screen_size,
            execute_timeout=self.config.waits.execute_timeout_s,
        )

    async def _grade(self, task: Task, last_action_fail: bool) -> Evaluation:
        """Postconfig + getters + metrics within ``eval_timeout`` seconds; raises
        ``DesktopError(kind="evaluator")`` when the evaluation hangs."""
        return await evaluate_task_within(
            task,
            self.client,
            timeout=self.config.eval_timeout,
            desktop=self.name,
            last_action_fail=last_action_fail,
            cache_dir=file_cache_dir(self.config.options),
            work_dir=self._work_dir,
            screen_size=self.screen_size,
        )

    def _new_work_dir(self) -> None:
        self._drop_work_dir()
        self._work_dir = scratch_dir(f"legato-{self.name.replace(':', '-')}-work-")

    def _drop_work_dir(self) -> None:
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None
