"""The ``osworld`` backend: OSWorld's ``DesktopEnv`` in a worker process per desktop.

desktop-env pins numpy<2, pandas<2.3 and torch 2.5 (docs/osworld.md §7), so each desktop is one
worker subprocess (``worker.py``) under the OSWorld interpreter (``legato osworld install``),
talking JSON lines over its stdin/stdout (:mod:`.channel`); the options below are checked and
turned into each worker's start request by :mod:`.options`.

Per attempt::

    reset(task)        worker reset: fast (kill the domain's apps, verify, clean HOME) or a
                       snapshot revert, then the task's setup via DesktopEnv.reset
    wait_after_reset   poll the VM server's GET /screenshot until stable (frame diff), capped;
                       provider local: then the server's wait for the launched apps' main
                       windows; then the windows the setup produced (``wmctrl -lx`` over
                       /execute; provider local: the server's GET /legato/windows)
    observe            worker observe (DesktopEnv.render, resized to the model's size there);
                       the first one once windows nobody asked for are closed (again before
                       the first action: ``..popups``)
    act(action)        render_code(action) -> DesktopEnv.step(code, pause=0)
    wait_after_action  poll /screenshot until stable   (or sleep fixed_wait)
    wait_before_eval   poll /screenshot until stable   (or sleep fixed_wait)
    evaluate(task)     DesktopEnv.evaluate(): the sole authority on the reward

Snapshot revert instead of a fast reset: ``DesktopConfig.fast_reset=False``, tasks of the
``os`` and ``multi_apps`` domains, any task :func:`needs_full_reset` flags (state outside
HOME, docs/osworld.md §6), and the first reset after a failure.

``DesktopConfig.options`` of the osworld backend:
  osworld_python  interpreter with desktop-env (default: the venv of ``legato osworld install``)
  provider        ``docker`` (default) | ``local`` | vmware | virtualbox | aws | azure | aliyun | volcengine
  path_to_vm, region, snapshot_name, os_type, client_password, headless, enable_proxy
                  passed to DesktopEnv as they are
  cache_dir       root of the per-desktop DesktopEnv cache dirs (default ~/.cache/legato/osworld-cache):
                  ``desktop-<i>`` for each desktop a batch opens (runners and spares), held by
                  the batch (``desktop-<i>.lock``); a second batch with the same root is refused
  work_dir        the workers' working directory (docker keeps ``docker_vm_data/`` there) and
                  their logs (``osworld-<i>.log``: DesktopEnv's logging and prints)
  ready           ``screenshot`` (default: poll the VM server's /screenshot) | ``server``
                  (provider local only: the local desktop server's own /legato/wait)
  fast_mode       how a fast reset cleans: ``vm`` (kill the domain's apps and restore a HOME
                  baseline through the VM server's ``/setup/execute``: every VM provider) or
                  ``server`` (provider local only, its default: the server's ``/legato/reset``)
  start_timeout   seconds a worker may take to start its VM (default 120; docker boots: 600)
  call_timeout    seconds for observe/act (default 120, OSWorld's execute allows 90)
  reset_timeout   seconds for a reset with the task's setup (default 300)
  user, template  provider local: the desktop servers' user (unsandboxed) and HOME template
  sandbox, network provider local: the desktop servers' sandbox (default true) and network
                  ("auto", the default, "host", "none" or "own"), as the local backend's options; DesktopEnv's
                  chromium_port and vlc_port are the server's (its ready line's ``ports``)
  log_level       the worker's logging level (default WARNING)

Provider ``local``: the "VM" is a project local desktop server this backend starts per desktop
(``desktops/server``); DesktopEnv, SetupController and OSWorld's evaluators run unchanged
against it (``provider_local.py``). Needs a ``python`` with pyautogui on the desktop's PATH
(``scripts/osworld_venv.sh``), as OSWorld's VM image has.
"""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from ...actions import Action
from ...errors import ConfigError, DesktopError
from ...images import Screenshot, png_codecs
from ...osworld_format import needs_full_reset
from ...tasks import Evaluation, Task
from ..base import DesktopConfig, WaitsByMode, act_facts, osworld_code, screenshot_of
from ..client import DesktopClient
from ..domains import REVERT_DOMAINS
from ..network import sandbox_options, server_network
from ..popups import PopupGuard, WmctrlWindows
from ..ready import ScreenshotReady
from ..server import ServerProcess
from .channel import WorkerProcess, confinement, desktop_ports
from .confine import hand_over
from .grader import evaluation_of
from .grader_log import AttemptLog
from .options import (
    claim_cache_dir,
    default_cache_root,
    plan_desktops,
    resolve_python,
    worker_env,
)

VM_TOKEN_ENV = "LEGATO_OSWORLD_VM_TOKEN"
#: Deadline per request that is not configurable on its own (seconds).
CLOSE_TIMEOUT_S = 60.0


class OSWorldDesktop(PopupGuard, WaitsByMode):
    """One OSWorld desktop (implements :class:`~legato_pipelines.desktops.base.Desktop`).

    ``start_request`` is the worker's ``start`` request (provider, screen, cache dir, ...);
    ``vm_server`` the local desktop server this desktop owns (provider ``local``), else None.
    """

    observe_resizes = True  # the worker hands out the model-size PNG (base.py)

    def __init__(
        self,
        name: str,
        config: DesktopConfig,
        *,
        python: str,
        start_request: dict[str, Any],
        work_dir: str,
        vm_server=None,
    ):
        self.name = name
        self.config = config
        self.python = python
        self.start_request = start_request
        self.work_dir = work_dir
        self.vm_server = vm_server
        self.screen_size = config.screen_size
        self.server_url: str | None = None
        self.worker: WorkerProcess | None = None
        self.last_reset: dict[str, Any] | None = None
        #: facts of the last reset's setup (steps OSWorld carries on after, as on the local
        #: backend: ``setup_facts.py``); kept on the attempt's record (``reset.setup_failures``)
        self.setup_failures: list[dict[str, Any]] = []
        self._attempt_log = AttemptLog()  # the current attempt's part of the worker's log
        self.last_start: dict[str, Any] | None = None
        self._force_revert = False
        self._http = None
        self._ready_signal = ScreenshotReady(self._fetch_png)
        self._ready_client = None
        opts = config.options
        self.ready_mode = opts.get("ready", "screenshot")
        self.start_timeout = float(
            opts.get("start_timeout", 600.0 if start_request["provider"] == "docker" else 120.0)
        )
        self.call_timeout = float(opts.get("call_timeout", 120.0))
        self.reset_timeout = float(opts.get("reset_timeout", 300.0))
        self._windows = WmctrlWindows(self._vm_execute)
        #: the lock on this desktop's DesktopEnv cache folder (``options.claim_cache_dir``)
        self.cache_lock: IO[str] | None = None
        self._guard_reset()

    def __repr__(self) -> str:
        return f"OSWorldDesktop({self.name!r}, provider={self.start_request['provider']!r})"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the VM host (provider local), the worker, and DesktopEnv (boots the VM)."""
        import httpx

        extra = {"LEGATO_OSWORLD_LOG": str(self.config.options.get("log_level", "WARNING"))}
        request = dict(self.start_request)
        headers = {}
        if self.vm_server is not None:
            if not self.vm_server.alive():
                await self.vm_server.stop()
                await self.vm_server.start()
            request["vm_url"] = self.vm_server.url
            request["ports"] = self.vm_server.ports  # LocalProvider(chromium=, vlc=)
            request["vm_token_env"] = VM_TOKEN_ENV
            extra[VM_TOKEN_ENV] = self.vm_server.token
            headers["Authorization"] = f"Bearer {self.vm_server.token}"
        confine = None
        if self.vm_server is not None:  # a local desktop's data: the worker runs confined
            cache = Path(request["cache_dir"])
            cache.mkdir(parents=True, exist_ok=True)
            hand_over(cache)  # DesktopEnv's downloads and getters write there
            confine = confinement([str(cache)])
        self.worker = WorkerProcess(
            self.python,
            env=worker_env(extra, provider=request["provider"]),
            cwd=self.work_dir,
            name=self.name,
            log_path=os.path.join(self.work_dir, f"{self.name}.log"),
            confine=confine,
        )
        await self.worker.start()
        try:
            if confine is not None:  # its network reaches its desktop's ports alone
                await self.worker.forward(desktop_ports(request["vm_url"], request.get("ports")))
            self.last_start = await self.worker.call("start", self.start_timeout, **request)
        except DesktopError:
            await self.worker.stop()
            raise
        self.server_url = self.last_start["server"]
        if self.last_start.get("screen"):
            self.screen_size = tuple(self.last_start["screen"])
        if self._http is not None:
            await self._http.aclose()
        self._http = httpx.AsyncClient(
            base_url=self.server_url, headers=headers, timeout=httpx.Timeout(10.0)
        )
        if self.vm_server is not None:  # its /legato/ routes: ready waits, windows
            if self._ready_client is not None:
                await self._ready_client.aclose()
            self._ready_client = DesktopClient(self.vm_server.url, self.vm_server.token)
        # the clean desktop: a launch during setup counts once the screen differs from it
        await self._ready_signal.capture_blank()

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        """Fast reset where allowed, else a snapshot revert; then the task's setup. ``"fast"`` | ``"revert"``."""
        revert = (
            self._force_revert
            or not self.config.fast_reset
            or task.domain in REVERT_DOMAINS
            or needs_full_reset(task)
        )
        task_config = {**task.config, "id": task.config.get("id") or task.task_id}
        self._attempt_log.start(self.worker.log_path if self.worker is not None else None)
        self._guard_reset()
        self._ready_signal.prepare(task)
        self.setup_failures = []
        try:
            self.last_reset = await self._call(
                "reset",
                self.reset_timeout,
                task_config=task_config,
                fast=not revert,
                domain=task.domain,
            )
        except DesktopError:
            self._force_revert = True
            raise
        self._force_revert = False
        self.setup_failures = list(self.last_reset.get("setup_failures") or [])
        return self.last_reset["kind"]

    async def observe(self, size: tuple[int, int] | None = None) -> Screenshot:
        """``DesktopEnv.render()``; at the model's ``size`` (width, height) when given, resized
        in the worker's process (``worker.model_png``), not the collector's; the first one once
        windows nobody asked for are closed (``..popups``)."""
        await self._guard_handout()
        fields = {"size": list(size), "codecs": png_codecs()} if size is not None else {}
        answer = await self._call("observe", self.call_timeout, **fields)
        return screenshot_of(base64.b64decode(answer["png"]), self.name, kind="vm")

    async def act(self, action: Action) -> dict[str, Any] | None:
        """:func:`~legato_pipelines.harness.render.render_osworld_code` (``render_pyautogui`` +
        OSWorld's ``<`` fix; text pyautogui cannot type through XTest) through
        ``DesktopEnv.step(code, pause=0)``.

        ``wait`` is OSWorld's ``WAIT`` (``step`` sleeps ``pause`` twice, so ``pause`` is half
        the wait). Returns ``{"not_typed": chars}`` when a ``type`` could not type some
        characters, else ``None``. Raises ``DesktopError(kind="act")`` when the action's code
        failed on the VM.
        """
        await self._guard_first_action()
        if action.action == "wait":
            seconds = self.config.waits.wait_action(action)
            await self._call("step", self.call_timeout + seconds, code="WAIT", pause=seconds / 2)
            return None
        code = osworld_code(action, self.name)
        result = await self._call("step", self.call_timeout, code=code, pause=0)
        if result.get("returncode") not in (0, None):
            raise DesktopError(
                f"{self.name}: the action's pyautogui code failed on the VM "
                f"(exit {result['returncode']}): {(result.get('error') or '').strip()[-300:]}",
                kind="act",
            )
        return act_facts(action, result.get("output"))

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        """``DesktopEnv.evaluate()`` (postconfig, getters, metrics) within ``eval_timeout`` s.

        An evaluator exception is ``Evaluation(0, error=reason)``; facts about the files the
        metrics compared (an xlsx with uncached formulas) are ``notes``, the reward unchanged;
        a dead VM or a hung evaluation raises ``DesktopError`` (kinds ``vm`` / ``evaluator``).
        """
        result = await self._call(
            "evaluate", self.config.eval_timeout, last_action_fail=last_action_fail
        )
        return evaluation_of(result)

    def take_grader_log(self) -> bytes | None:
        """What the worker wrote to its log (``<work_dir>/<name>.log``: DesktopEnv's logging,
        tracebacks, the facts of ``setup_facts.py``) since the last reset began, for the run
        directory; ``None`` when nothing (``grader_log.AttemptLog``)."""
        return self._attempt_log.take()

    async def recover(self) -> None:
        """Restart the worker and its VM (DesktopEnv constructed anew); next reset reverts.

        Raises ``DesktopError(kind="vm")`` when the VM does not come back.
        """
        self._force_revert = True
        if self.worker is not None:
            await self.worker.stop()
        try:
            await self.start()
        except DesktopError as exc:
            raise DesktopError(f"{self.name}: recovery failed: {exc}", kind="vm") from None

    async def close(self) -> None:
        if self.worker is not None and self.worker.alive():
            try:
                await self.worker.call("close", CLOSE_TIMEOUT_S)
            except DesktopError:
                pass
            await self.worker.stop()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._ready_client is not None:
            await self._ready_client.aclose()
            self._ready_client = None
        if self.vm_server is not None:
            await self.vm_server.stop()
        if self.cache_lock is not None:
            self.cache_lock.close()
            self.cache_lock = None

    # -- helpers ---------------------------------------------------------------------------------

    async def _call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        if self.worker is None or not self.worker.alive():
            self._force_revert = True
            raise DesktopError(f"{self.name}: the OSWorld worker is not running", kind="transport")
        try:
            return await self.worker.call(op, timeout, **fields)
        except DesktopError:
            self._force_revert = True
            raise

    async def grab_frame(self) -> np.ndarray:
        """One frame of ``GET /screenshot`` from the VM server (:class:`ScreenshotReady`)."""
        return await self._ready_signal.grab_frame()

    async def _vm_execute(self, argv: list[str]) -> dict[str, Any]:
        """``POST /execute`` on the VM server (wmctrl for :mod:`..popups`); its JSON answer.
        Raises ``DesktopError(kind="vm")`` when the server does not answer."""
        import httpx

        try:
            response = await self._http.post(
                "/execute", json={"command": argv, "shell": False}, timeout=30.0
            )
        except httpx.HTTPError as exc:
            raise DesktopError(f"{self.name}: POST /execute: {exc}", kind="vm") from None
        if response.status_code != 200:
            return {"returncode": None, "output": "", "error": response.text[:300]}
        return response.json()

    async def _list_windows(self) -> list[dict[str, Any]] | None:
        """Provider local: the desktop server's windows, which say which belong to the apps
        the setup launched (never popups); else ``wmctrl`` on the VM."""
        if self._ready_client is not None:
            return await self._ready_client.windows()
        return await self._windows.list()

    async def _close_windows(self, ids: list[Any]) -> dict[Any, str]:
        if self._ready_client is not None:
            return await self._ready_client.close_windows(ids)
        return await self._windows.close(ids)

    async def _fetch_png(self) -> bytes:
        import httpx

        try:
            response = await self._http.get("/screenshot")
        except httpx.HTTPError as exc:
            raise DesktopError(f"{self.name}: GET /screenshot: {exc}", kind="vm") from None
        if response.status_code != 200:
            raise DesktopError(
                f"{self.name}: GET /screenshot: HTTP {response.status_code}", kind="vm"
            )
        return response.content

    async def _ready(
        self, mode: str, cap_s: float
    ) -> tuple[float, bool] | tuple[float, bool, bool]:
        """Stable screen (``reset``: after the task's setup; when the setup launched or opened
        something, the screen must first differ from the clean desktop, as the local server's
        launch wait does; heavy domains get the 0.5 s stable window). Provider local, after a
        reset or an action: then the server's ``apps`` wait (a terminal Ctrl+Alt+T opened, an
        app the setup launched maps its main window: GIMP's comes seconds after its splash)."""
        # an app the setup launched: its main window, within its own cap (Waits)
        apps_cap = {"app_window_s": self.config.waits.ready_app_window_s} if mode == "reset" else {}
        if self.ready_mode == "server":
            result = await self._ready_client.wait(mode, timeout_s=cap_s, **apps_cap)
            return (
                float(result["ready_s"]),
                bool(result.get("timed_out")),
                bool(result.get("undrawn")),
            )
        result = await self._ready_signal.wait(mode, timeout_s=cap_s)
        if mode not in ("reset", "action") or result.timed_out or self._ready_client is None:
            return result.ready_s, result.timed_out
        # provider local: a terminal Ctrl+Alt+T opened, the apps the setup launched: until
        # their windows are up (at once when there is none)
        more = await self._ready_client.wait(
            "apps", timeout_s=max(cap_s - result.ready_s, 0.1), **apps_cap
        )
        return (
            result.ready_s + float(more["ready_s"]),
            bool(more.get("timed_out")),
            bool(more.get("undrawn")),
        )


async def open_osworld_desktops(config: DesktopConfig, n: int) -> list[OSWorldDesktop]:
    """Start ``n`` osworld desktops concurrently: a worker each, DesktopEnv constructed once.

    Raises ``ConfigError`` for bad options or a missing interpreter, ``DesktopError`` when a
    desktop fails to start (the others are closed).
    """
    requests = plan_desktops(config, n)  # desktop-0 .. desktop-<n-1>: runners and spares
    python = resolve_python(config)
    opts = config.options
    work_root = Path(opts.get("work_dir") or default_cache_root() / "work").expanduser().resolve()
    locks = []
    try:  # every folder is this batch's alone, or nothing starts
        for request in requests:
            locks.append(claim_cache_dir(request["cache_dir"]))
    except ConfigError:
        for lock in locks:
            lock.close()
        raise
    desktops = []
    for i, (request, lock) in enumerate(zip(requests, locks, strict=True)):
        server = None
        if request["provider"] == "local":
            sandbox, network = sandbox_options(opts)
            server = ServerProcess(
                width=config.screen_width,
                height=config.screen_height,
                user=opts.get("user"),
                template=opts.get("template"),
                sandbox=sandbox,
                network=server_network(network),
            )
        desktops.append(
            OSWorldDesktop(
                f"osworld-{i}",
                config,
                python=python,
                start_request=request,
                work_dir=str(work_root),
                vm_server=server,
            )
        )
        desktops[-1].cache_lock = lock  # released when the desktop closes
    results = await asyncio.gather(*(d.start() for d in desktops), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        await asyncio.gather(*(d.close() for d in desktops), return_exceptions=True)
        first = failures[0]
        if isinstance(first, (ConfigError, DesktopError)):
            raise first
        raise DesktopError(
            f"{len(failures)} of {n} osworld desktops failed to start: {first}", kind="vm"
        )
    return desktops
