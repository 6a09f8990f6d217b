"""OSWorld's own setup and evaluators for a local desktop: the osworld worker, attached.

When an OSWorld interpreter is installed (``legato osworld install``, scripts/osworld_venv.sh;
desktop option ``grader``, :mod:`..osworld.grader`), each local desktop gets one osworld worker
(``desktops/osworld_worker/worker.py``, the same process and JSON protocol as the osworld backend)
whose ``DesktopEnv`` drives that desktop's server through provider ``local`` (by URL and
token). The local backend keeps owning reset, observe, act and the ready waits; the worker
runs only the task's setup (OSWorld's ``SetupController``: ``chrome_open_tabs`` over CDP,
``download`` from the cache, ``open``, ``execute``...) and ``DesktopEnv.evaluate`` (every
metric and getter of desktop-env, FAIL as the last action for infeasible tasks). With
``template=True`` (the local backend's graders) importing desktop_env is paid once for all
desktops: the worker is forked from one preloaded template worker shared by the graders
(``osworld_worker/template.py``). Each worker grades one attempt: after its evaluation it is
retired; the next attempt's is forked and attached in the background while the attempt runs
(:meth:`OSWorldGrader._prepare_next`).

Files: DesktopEnv reads a task's files from ``<cache>/<task_id>/`` under OSWorld's names and
writes what its getters fetch there too. Each desktop has its own such directory; before a
task's setup it is emptied and every file the task references that the read-only file cache
(option ``cache_dir``) or a ``file://`` URL holds is copied in (copied, not linked: a getter
writing a file of the same name must never change the cache). DesktopEnv never downloads then,
unless the preflight let an uncached URL through (it does not).

Confinement (``osworld_worker/confine.py``, docs/sandbox.md §6): the worker reads what the desktop
returns (a policy with ``sudo`` inside can make ``gsettings`` print Python that a metric
``eval``s), so it runs in namespaces of its own as the grader user, forked or spawned alike.
Its work directory and ``cache/`` are root's with the grader's group (0750: it reads them and
replaces nothing in them); each task's ``cache/<task_id>/`` is handed to it once staged (its
getters write there), and is the only host path it can write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from ...errors import DesktopError
from ...osworld_format.files import cache_file_paths, task_files
from ...osworld_format.sources import cache_dir_path, find_source
from ...scratch import scratch_dir
from ...tasks import Evaluation, Task
from ..child_env import worker_env
from .channel import WorkerProcess, confinement, desktop_ports
from .confine import hand_over, prepare_dir
from .grader import evaluation_of
from .grader_log import AttemptLog
from .template import acquire_template, release_template

VM_TOKEN_ENV = "LEGATO_OSWORLD_VM_TOKEN"
START_TIMEOUT_S = 120.0
SETUP_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 30.0


def stage_task_files(task: Task, cache_dir: Path | None, task_dir: Path) -> list[str]:
    """Empty ``task_dir`` and copy into it, under the names DesktopEnv looks for, every file
    ``task`` references that is local (``file://``) or in ``cache_dir``: a ``download`` file as
    ``<uuid5(NAMESPACE_URL, url)>_<basename(path)>`` (SetupController), a ``cloud_file`` as its
    ``dest`` (``get_cloud_file``), a ``cache_file`` getter's ``path`` from ``cache_dir/<task_id>/``
    or ``cache_dir/`` (``get_cache_file``). Returns the names written. Files nowhere local are skipped
    (the preflight refuses such tasks on ``local``)."""
    import uuid

    shutil.rmtree(task_dir, ignore_errors=True)
    task_dir.mkdir(parents=True)
    written = []
    for file in task_files(task):
        source = find_source(file.url, dest=file.dest, cache_dir=cache_dir, task_id=task.task_id)
        if source is None or not file.dest:
            continue
        if file.kind == "download":
            name = f"{uuid.uuid5(uuid.NAMESPACE_URL, file.url)}_{os.path.basename(file.dest)}"
        else:
            name = file.dest
        target = task_dir / name
        if target.exists() or not target.resolve().is_relative_to(task_dir.resolve()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(name)
    for name in cache_file_paths(task):  # get_cache_file: <cache dir>/<path>, as OSWorld's host
        roots = [cache_dir / task.task_id, cache_dir] if cache_dir is not None else []
        source = next((r / name for r in roots if (r / name).is_file()), None)
        target = task_dir / name
        if source is None or target.exists():
            continue
        if not target.resolve().is_relative_to(task_dir.resolve()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(name)
    return written


class OSWorldGrader:
    """One osworld worker attached to the local desktop server at ``url`` (``token``).

    ``python``: the OSWorld interpreter; ``screen_size``: (width, height) pixels; ``cache_dir``:
    the read-only file cache (option ``cache_dir``) or ``None``; ``name``: the desktop's name;
    ``template``: fork the worker from the template shared by this interpreter's graders (a
    lease from the first :meth:`spawn` to :meth:`close`). Each worker logs to a file of its
    own in the work directory (``worker-<n>.log``); what the workers of an attempt wrote is
    :meth:`take_grader_log`'s, for the run directory (the work directory goes with the batch).
    Every method raises ``DesktopError`` when the worker fails or misses its deadline (kinds
    as the osworld backend's: ``setup``, ``evaluator``, ``vm``, ``transport``).
    """

    def __init__(
        self,
        *,
        name: str,
        python: str,
        url: str,
        token: str,
        screen_size: tuple[int, int],
        cache_dir: Any = None,
        template: bool = False,
    ):
        self.name, self.python, self.url, self.token = name, python, url, token
        self.template = template
        self._lease = None  # the shared template (osworld/template.py), from the first spawn
        self.screen_size = screen_size
        #: the server's host ports of the desktop's CDP bridge and VLC (``{"chromium", "vlc"}``,
        #: its ready line's ``ports``): DesktopEnv's chromium_port / vlc_port; empty: 9222/8080
        self.ports: dict[str, int] = {}
        self.cache_dir = cache_dir_path(cache_dir)
        self.work_dir = Path(scratch_dir(f"legato-{name}-osworld-"))
        (self.work_dir / "cache").mkdir()
        if os.geteuid() == 0:  # else spawn refuses (channel.confinement)
            for path in (self.work_dir, self.work_dir / "cache"):
                prepare_dir(path, writable=False)
        self.worker: WorkerProcess | None = None
        self.last_start: dict[str, Any] | None = None
        self.last_preload: dict[str, Any] | None = None
        self._spawned_with: str | None = None  # the token the running worker was given
        self._attached = False  # the running worker's DesktopEnv was started
        #: the next attempt's worker, prepared during this one (:meth:`_prepare_next`)
        self._next: asyncio.Task | None = None
        self._retiring: set[asyncio.Task] = set()  # workers being stopped (:meth:`_retire`)
        self._used = False  # the worker ran a setup: it serves no other attempt
        self._task_config: dict[str, Any] | None = None  # the last setup's, for re-evaluation
        #: seconds of the last setup / evaluation inside the worker (DesktopEnv's own work)
        self.last_setup_s: float | None = None
        self.last_eval_s: float | None = None
        self._workers_made = 0  # numbers the workers' log files
        self._attempt_log = AttemptLog()  # the current attempt's part of the workers' logs

    def __repr__(self) -> str:
        return f"OSWorldGrader({self.name!r}, {self.url!r})"

    def alive(self) -> bool:
        return self.worker is not None and self.worker.alive()

    async def spawn(self) -> None:
        """Start the worker process and import desktop_env in it (op ``preload``): the ~1.4 s
        import needs no desktop, so it can run while the desktop server starts. The worker
        gets ``token`` in its environment now; :meth:`start` with the same token attaches it.
        Raises ``DesktopError`` when the worker fails or misses :data:`START_TIMEOUT_S`.

        With ``template`` the worker is forked from the shared template (started by the first
        grader that spawns), its ``preload`` then finds desktop_env imported; it is spawned
        when there is no template to fork from. A forked worker also comes with the batch's
        metric and getter modules imported (the template imported them before its first
        fork: ``WorkerTemplate.evaluators``); a spawned one imports them at its first setup."""
        await self.stop()
        self.worker = await self._new_worker()
        self._spawned_with = self.token

    async def _new_worker(self) -> WorkerProcess:
        """A new worker holding ``token``, started (forked or spawned, confined) and preloaded;
        not :attr:`worker` yet. Stopped again when anything fails (``DesktopError``)."""
        if self.template and self._lease is None:
            self._lease = acquire_template(self.python)
        template = await self._lease.ready() if self._lease is not None else None
        self._workers_made += 1
        worker = WorkerProcess(
            self.python,
            env=worker_env({VM_TOKEN_ENV: self.token}, provider="local"),  # no credential
            cwd=str(self.work_dir),
            name=f"{self.name}-osworld",
            log_path=str(self.work_dir / f"worker-{self._workers_made}.log"),
            template=template,
            confine=confinement(),
        )
        await worker.start()
        try:
            self.last_preload = await worker.call("preload", START_TIMEOUT_S)
        except BaseException:
            await worker.stop(grace=5.0)
            raise
        return worker

    async def _attach(self, worker: WorkerProcess) -> None:
        """Connect ``worker``'s network to the desktop's ports and start its ``DesktopEnv``
        on the desktop (op ``start``); stopped again when that fails."""
        request = {
            "provider": "local",
            "vm_url": self.url,
            "vm_token_env": VM_TOKEN_ENV,
            "screen": list(self.screen_size),
            "cache_dir": str(self.work_dir / "cache"),
            "fast_mode": "server",
            "ports": self.ports,
        }
        try:
            await worker.forward(desktop_ports(self.url, self.ports))
            self.last_start = await worker.call("start", START_TIMEOUT_S, **request)
        except BaseException:
            await worker.stop(grace=5.0)
            raise

    async def start(self, url: str | None = None, token: str | None = None) -> None:
        """Start the worker's ``DesktopEnv`` on the desktop (a new ``url``/``token`` after the
        server was restarted). A worker from :meth:`spawn` that is alive, not attached yet and
        holds this token is used; any other is replaced by a new one. Nothing on the desktop
        is reset. A next attempt's worker being prepared (:meth:`_prepare_next`) is dropped."""
        await self._drop_next()
        self.url, self.token = url or self.url, token or self.token
        fresh = self.alive() and not self._attached and self._spawned_with == self.token
        if not fresh:
            await self.spawn()
        self._attached = True
        try:
            await self._attach(self.worker)
        except DesktopError:
            await self.stop()
            raise

    async def setup(self, task: Task, timeout: float = SETUP_TIMEOUT_S) -> list[dict[str, Any]]:
        """The task's setup by OSWorld's SetupController; the steps it carried on after
        (``setup_facts.py``: ``[{step, type, exit_status, error}]``). The worker prepared
        during the last attempt (:meth:`_prepare_next`) runs it; a new one is started when
        there is none (the first attempt's is :meth:`start`'s) or it failed. Once the setup
        ran, the next attempt's worker is prepared in the background; a setup that failed
        retires its worker (it may have read the desktop's answers), as does a setup after one
        whose attempt was not evaluated (a task without an evaluator)."""
        if self._used:
            self._retire()
        if not self.alive():
            await self._take_next()
        if not self.alive():
            await self.start()
        task_dir = self.work_dir / "cache" / task.task_id
        stage_task_files(task, self.cache_dir, task_dir)
        hand_over(task_dir)  # the grader's getters write there
        task_config = {**task.config, "id": task.task_id}
        if not task.evaluator:  # DesktopEnv needs one to set up; LocalDesktop grades it not
            task_config["evaluator"] = {"func": "infeasible"}
        self._task_config = task_config
        self._used = True
        self._attempt_log.start(self.worker.log_path)
        try:
            answer = await self.worker.call("setup", timeout, task_config=task_config)
        except BaseException:
            self._retire()
            raise
        self._prepare_next()
        self.last_setup_s = answer.get("setup_s")
        return list(answer.get("setup_failures") or [])

    async def evaluate(self, *, last_action_fail: bool, timeout: float) -> Evaluation:
        """``DesktopEnv.evaluate()`` for the task of the last :meth:`setup`: an evaluator
        exception is a reward 0 with its reason; ``notes`` are facts about the files compared.
        The worker is retired afterwards, whatever happened (:meth:`_retire`): a second
        evaluation of the same attempt (no setup in between) runs in a fresh worker that loads
        the task without setting it up again (op ``load_task``)."""
        if not self.alive() and self._task_config is not None:
            await self._take_next()
            if not self.alive():
                await self.start()
            self._attempt_log.mark(self.worker.log_path)  # this attempt's grade is logged here
            try:
                await self.worker.call("load_task", START_TIMEOUT_S, task_config=self._task_config)
            except BaseException:
                self._retire()
                raise
            self._prepare_next()
        if not self.alive():
            raise DesktopError(
                f"{self.name}: the OSWorld grader is not running (no task was set up on it)",
                kind="evaluator",
            )
        try:
            result = await self.worker.call("evaluate", timeout, last_action_fail=last_action_fail)
        finally:
            self._retire()
        self.last_eval_s = result.get("eval_s")
        return evaluation_of(result)

    def take_grader_log(self) -> bytes | None:
        """What this attempt's workers wrote to their logs since its setup (its setup and
        evaluation: OSWorld's logging, tracebacks, the facts of ``setup_facts.py``), at most
        ``grader_log.GRADER_LOG_MAX_BYTES``; ``None`` when they wrote nothing. The log files
        of workers that have retired are removed then (the work directory is the batch's)."""
        paths = self._attempt_log.paths
        data = self._attempt_log.take()
        current = self.worker.log_path if self.worker is not None else None
        for path in paths:
            if path != current:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return data

    def _retire(self) -> None:
        """Stop the worker that ran this attempt's setup or evaluation, in the background. It
        ran OSWorld's code on this attempt's answers, which may have changed anything in its
        process (a metric replaced, a thread left running): it grades nothing more, so a
        crafted answer changes its own attempt's reward at most. Stopping it (SIGTERM; its
        DesktopEnv's ``close`` leaves the desktop alone) ends every process of its pid
        namespace."""
        old, self.worker = self.worker, None
        self._attached, self._spawned_with, self._used = False, None, False
        if old is not None:
            stopping = asyncio.get_running_loop().create_task(old.stop(grace=5.0))
            self._retiring.add(stopping)
            stopping.add_done_callback(self._retiring.discard)

    def _prepare_next(self) -> None:
        """Start preparing the next attempt's worker (forked, connected, its DesktopEnv
        started: :meth:`_new_worker`, :meth:`_attach`) while this attempt runs, so that the
        next setup finds it ready (:meth:`_take_next`). It reads nothing of the desktop's
        before its own setup."""
        if self._next is not None:
            return
        token = self.token

        async def prepared() -> tuple[WorkerProcess, str]:
            worker = await self._new_worker()
            await self._attach(worker)
            return worker, token

        self._next = asyncio.get_running_loop().create_task(prepared())

    async def _take_next(self) -> None:
        """Make the prepared worker :attr:`worker` when it started and holds the current
        token (else it is stopped, and the caller starts one)."""
        task, self._next = self._next, None
        if task is None:
            return
        try:
            worker, token = await task
        except DesktopError:
            return
        if token != self.token or not worker.alive():
            await worker.stop(grace=5.0)
            return
        self.worker, self._attached, self._spawned_with = worker, True, token

    async def _drop_next(self) -> None:
        """Cancel the next attempt's worker being prepared, or stop it if it is ready."""
        task, self._next = self._next, None
        if task is None:
            return
        task.cancel()
        try:
            worker, _ = await task
        except (asyncio.CancelledError, DesktopError):
            return
        await worker.stop(grace=5.0)

    async def stop(self) -> None:
        """Stop the worker (its DesktopEnv's ``close`` leaves the desktop alone: provider local);
        cancelled while the worker answers ``close``, the worker is still stopped."""
        worker, self.worker = self.worker, None
        self._attached, self._spawned_with = False, None
        if worker is None:
            return
        try:
            if worker.alive():
                with contextlib.suppress(DesktopError):
                    await worker.call("close", CLOSE_TIMEOUT_S)
        finally:
            await worker.stop(grace=5.0)

    async def close(self) -> None:
        """Stop the worker, end its lease on the template and remove its work directory (all
        three even when cancelled midway: the last lease stops the shared template)."""
        try:
            await self._drop_next()
            await self.stop()
            if self._retiring:
                await asyncio.gather(*self._retiring, return_exceptions=True)
        finally:
            lease, self._lease = self._lease, None
            try:
                if lease is not None:
                    await release_template(lease)
            finally:
                shutil.rmtree(self.work_dir, ignore_errors=True)
