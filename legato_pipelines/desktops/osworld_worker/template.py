"""One preloaded osworld worker per interpreter that the local graders' workers are forked from.

Every local desktop's OSWorld grader has its own osworld worker, and each worker's first act is
importing desktop_env (op ``preload``: ~1.0-1.4 s of CPU on 2 cores). A batch on 2 desktops
with 2 spares paid that 4 times while the first attempts ran (issue 18). Instead the first
grader that spawns starts a *template* worker that does the import once; every grader's worker
is then forked from it (op ``fork``, :mod:`.channel`): a few milliseconds of CPU each.

The template is shared by the graders of one interpreter on one event loop (the runners' and
the spares' desktops are opened by separate calls), counted by lease: :func:`acquire_template`
when a grader first spawns, :func:`release_template` when it closes; the last release stops
the template. A template that cannot start is not retried; its graders spawn their own
workers then (:class:`.channel.WorkerProcess` does so, with a warning, whenever a fork fails).

A batch starts the template before it opens any desktop (:func:`template_started`, entered
by the engine through ``desktops.warm_up``): the import then runs beside the batch's policy
check and run-directory work instead of after them (~0.4 s of start-up on 2 cores).

The batch's tasks name their metrics and getters (:attr:`WorkerTemplate.evaluators`); each
worker imported their modules at its first setup (pandas, openpyxl, lxml...: ~0.45 s of CPU
for the local suite's tasks), on the first attempts' critical path and beside the other
workers' same imports. The template imports them once (op ``warm``) right after its
``preload``, before its first fork: every worker is forked with them. The first forks wait
for it, in the shadow of the desktop servers' start (BENCHMARKS.md, issue 18 part 9: 0.93x
the suite's wall against importing them in the template after the first desktops' forks,
where the template's import ran beside the first two workers' own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections.abc import Sequence

from ...errors import ConfigError, DesktopError
from ...scratch import scratch_dir
from ..child_env import SINGLE_THREADED, worker_env
from ..processes import LoopShared, pdeathsig_guard, take_early
from .channel import WORKER_SCRIPT, WorkerProcess

PRELOAD_TIMEOUT_S = 120.0  # the import under a loaded machine (the graders' own deadline)
WARM_TIMEOUT_S = 30.0  # op warm (the metric modules' imports); passed, the template is stopped
log = logging.getLogger(__name__)


class WorkerTemplate:
    """The template worker of interpreter ``python``: started and preloaded by the first
    :meth:`ready`, stopped by :meth:`close`. ``users``: the leases held on it."""

    def __init__(self, python: str):
        self.python = python
        self.users = 0
        self.worker: WorkerProcess | None = None
        self.failed = False  # it could not start: not retried
        #: the batch's tasks' evaluator objects (distinct): what :meth:`_warm` imports
        self.evaluators: list[dict] = []
        self.warmed: dict | None = None  # op warm's answer, once it ran
        self._dir: str | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> WorkerProcess | None:
        """The running, preloaded template (started now by the first caller; concurrent
        callers wait for it), or ``None`` when it could not start (a warning is logged once;
        the caller spawns its worker). A template that died later is returned as it is: the
        fork from it fails and the caller spawns."""
        async with self._lock:
            if self.worker is not None or self.failed:
                return self.worker
            argv, env = preloading_command(self.python)
            early = take_early(argv, env)  # started on legato's first line, importing already
            self._dir = early.cwd if early else scratch_dir("legato-osworld-template-")
            worker = WorkerProcess(
                self.python,
                env=env,
                cwd=self._dir,
                name="osworld-template",
                log_path=f"{self._dir}/worker.log",
            )
            try:
                if early is not None:
                    await worker.adopt(early.popen)
                else:
                    await worker.start()
                # a template started with --preload answers once its import has ended
                await worker.call("preload", PRELOAD_TIMEOUT_S)
                await self._warm(worker)
                if not worker.alive():
                    raise DesktopError(
                        "it ended while importing the tasks' metric modules", kind="transport"
                    )
            except (ConfigError, DesktopError) as exc:
                log.warning("the osworld template worker did not start (%s); spawning each", exc)
                self.failed = True
                await worker.stop(grace=5.0)
                return None
            except BaseException:  # cancelled: the next caller starts it again
                await worker.stop(grace=5.0)
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
                raise
            self.worker = worker
            return worker

    async def _warm(self, worker: WorkerProcess) -> None:
        """Import the modules of :attr:`evaluators` in the preloaded template (op ``warm``),
        before its first fork; the answer is kept in :attr:`warmed`. A failure is logged and
        left (warming is an optimisation); one that passed :data:`WARM_TIMEOUT_S` stopped
        the template, which :meth:`ready` then treats as one that did not start (each grader
        spawns its worker)."""
        if not self.evaluators:
            return
        try:
            self.warmed = await worker.call("warm", WARM_TIMEOUT_S, evaluators=self.evaluators)
        except DesktopError as exc:
            log.warning("the osworld template did not import the tasks' metrics (%s)", exc)

    async def close(self) -> None:
        """Stop the template (its forked workers live on) and remove its directory."""
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop(grace=5.0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def preloading_command(python: str) -> tuple[list[str], dict[str, str]]:
    """The command line of a template worker that imports desktop_env as soon as it starts
    (``worker.py --preload``; under ``setpriv --pdeathsig TERM`` where there is one: it ends
    with ``legato`` even before anybody took it), and its whole environment: a grader's,
    without its VM token; one BLAS thread (the template must have no thread but the one that
    forks). Used by
    ``desktops/early.py``, which starts it on ``legato``'s first line, and to recognise it in
    :meth:`WorkerTemplate.ready`."""
    guard = pdeathsig_guard()
    return [*guard, python, "-I", str(WORKER_SCRIPT), "--preload"], worker_env(
        SINGLE_THREADED, provider="local"
    )


#: interpreter -> its template, per event loop (asyncio objects belong to one loop)
_templates = LoopShared(WorkerTemplate)


def acquire_template(python: str) -> WorkerTemplate:
    """A lease on the template of ``python`` on the running event loop (created, not started,
    by the first lease). Must be called from a coroutine; pair with :func:`release_template`."""
    return _templates.acquire(python)


async def release_template(template: WorkerTemplate) -> None:
    """End one lease; the last one stops the template (a later lease starts a new one)."""
    await _templates.release(template, template.python)


@contextlib.asynccontextmanager
async def template_started(python: str, evaluators: Sequence[dict] = ()):
    """Hold a lease on the template of ``python`` for the block and start it now, in the
    background (:meth:`.LoopShared.started`): graders that spawn inside the block find it
    preloaded, or wait for the start under way. A template that cannot start is logged once,
    as in :meth:`WorkerTemplate.ready`. ``evaluators``: the batch's tasks' evaluator objects,
    whose modules the template imports before its first fork (duplicates dropped; a template
    already started by another lease keeps what it imported)."""
    async with _templates.started(python) as template:
        distinct: dict[str, dict] = {}
        for evaluator in evaluators:
            if isinstance(evaluator, dict) and evaluator:
                distinct.setdefault(json.dumps(evaluator, sort_keys=True, default=str), evaluator)
        template.evaluators = list(distinct.values())
        yield template
