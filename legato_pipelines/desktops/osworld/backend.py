"""The ``osworld`` backend: OSWorld's ``DesktopEnv`` in a worker process per desktop.

desktop-env pins numpy<2, pandas<2.3 and torch 2.5 (docs/osworld.md §7), so each desktop is one
worker subprocess (``worker.py``) under the OSWorld interpreter (``legato osworld install``),
talking JSON lines over its stdin/stdout. This side is asyncio only: every request has a
deadline; a worker that misses one is stopped (SIGTERM: it closes its VM; SIGKILL after a
grace period) and the call raises :class:`~legato_pipelines.errors.DesktopError`.

Per attempt::

    reset(task)        worker reset: fast (kill the domain's apps, verify, clean HOME) or a
                       snapshot revert, then the task's setup via DesktopEnv.reset
    wait_after_reset   poll the VM server's GET /screenshot until stable (frame diff), capped
    observe            worker observe (DesktopEnv.render)
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
  cache_dir       root of the per-desktop DesktopEnv cache dirs (default ~/.cache/legato/osworld-cache)
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
  user, template  provider local: the desktop servers' user and HOME template
  log_level       the worker's logging level (default WARNING)

Provider ``local``: the "VM" is a project local desktop server this backend starts per desktop
(``desktops/local``); DesktopEnv, SetupController and OSWorld's evaluators run unchanged
against it (``provider_local.py``). Needs a ``python`` with pyautogui on the desktop's PATH
(``scripts/osworld_venv.sh``), as OSWorld's VM image has.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...actions import Action
from ...errors import ConfigError, DesktopError
from ...images import Screenshot
from ...tasks import Task
from ..base import DesktopConfig, Evaluation, Wait, WaitsByMode
from ..screenshot_ready import ScreenshotReady
from .install import default_venv, venv_python

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
PROVIDERS = ("docker", "local", "vmware", "virtualbox", "aws", "azure", "aliyun", "volcengine")
REVERT_DOMAINS = frozenset({"os", "multi_apps"})  # state outside /home/user (docs/osworld.md §6)
OPTION_NAMES = frozenset(
    {
        "osworld_python",
        "provider",
        "path_to_vm",
        "region",
        "snapshot_name",
        "os_type",
        "client_password",
        "headless",
        "enable_proxy",
        "cache_dir",
        "work_dir",
        "ready",
        "fast_mode",
        "start_timeout",
        "call_timeout",
        "reset_timeout",
        "user",
        "template",
        "log_level",
    }
)
#: Environment variables a worker inherits (providers' credentials and endpoints); nothing
#: else, so neither the policy key nor a stray configuration reaches DesktopEnv.
PASS_ENV_PREFIXES = (
    "DOCKER_",
    "HF_",
    "AWS_",
    "AZURE_",
    "ALIYUN_",
    "ALIBABA",
    "VOLCENGINE_",
    "KVM",
)
PASS_ENV = ("HOME", "PATH", "LANG", "LC_ALL", "TMPDIR", "http_proxy", "https_proxy", "no_proxy")
SECRET_ENV = ("LEGATO_POLICY_KEY",)
VM_TOKEN_ENV = "LEGATO_OSWORLD_VM_TOKEN"
#: The HOME baseline of a local desktop in ``fast_mode`` ``vm`` (expanded by the desktop's shell).
LOCAL_VM_BASELINE = "$TMPDIR/legato-home-baseline"
PROTOCOL_LINE_LIMIT = 64 * 2**20  # bytes: a base64 screenshot fits on one line
STOP_GRACE_S = 30.0  # a worker closing a docker VM needs a while
DEFAULT_WAIT_ACTION_S = 1.0
#: Deadline per request that is not configurable on its own (seconds).
CLOSE_TIMEOUT_S = 60.0
#: What a missed deadline counts as, per request.
DEADLINE_KIND = {
    "start": "vm",
    "reset": "setup",
    "observe": "vm",
    "step": "vm",
    "evaluate": "evaluator",
    "close": "vm",
    "plan": "transport",
}


#: How OSWorld types ``<`` (its ``_fix_pyautogui_less_than_bug``): pyautogui's X11 backend
#: types ``>`` for ``<`` (pyautogui issue 198).
LESS_THAN = 'pyautogui.hotkey("shift", ",")'


def render_code(action: Action) -> str:
    """pyautogui code for ``action``: :func:`render_pyautogui`, with OSWorld's ``<`` fix.

    ``DesktopEnv.step`` rewrites ``<`` only inside ``typewrite('...')`` without arguments;
    the harness renders ``typewrite('...', interval=0.03)`` (newer OSWorld Qwen agents), which
    the rewrite misses, so ``<`` would arrive as ``>``. The same fix is applied here on the
    structured action: the text is split at ``<`` and each ``<`` typed as shift+comma.
    """
    from ...harness import render_pyautogui

    if action.action == "type" and action.text and "<" in action.text:
        parts = action.text.split("<")
        code = []
        for i, part in enumerate(parts):
            if part:
                code.append(render_pyautogui(replace(action, text=part)))
            if i < len(parts) - 1:
                code.append(LESS_THAN)
        return "\n".join(code)
    return render_pyautogui(action)


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/legato/osworld-cache`` (``~/.cache/...``): DesktopEnv cache dirs."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "legato" / "osworld-cache"


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The clean environment of a worker: a pass-list of the parent's plus ``extra``.

    ``PYTHON_DOTENV_DISABLED=1`` stops desktop_env's import-time ``load_dotenv()``
    (docs/osworld.md §8).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in PASS_ENV or k.startswith(PASS_ENV_PREFIXES)) and k not in SECRET_ENV
    }
    env["PYTHON_DOTENV_DISABLED"] = "1"
    env.update(extra or {})
    return env


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk. Raises ``DesktopError`` if not a PNG."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n":
        raise DesktopError("the VM sent a screenshot that is not a PNG", kind="vm")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


class WorkerProcess:
    """One worker subprocess and its JSON-lines channel.

    ``python``: the OSWorld interpreter; ``env``: the worker's whole environment; ``cwd``: its
    working directory. :meth:`call` sends one request and waits at most ``timeout`` seconds.
    """

    def __init__(
        self,
        python: str,
        *,
        env: dict[str, str],
        cwd: str,
        name: str = "osworld",
        log_path: str | None = None,
    ):
        self.python, self.env, self.cwd, self.name = python, env, cwd, name
        self.log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._broken = False  # a call was cancelled mid-way: the channel is out of step

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self._broken

    async def start(self) -> None:
        """Spawn the worker (``<python> -I worker.py``; isolated mode: no user site, no PYTHON* env).

        Its stderr (DesktopEnv's logging and prints) is appended to ``log_path`` when given.
        """
        os.makedirs(self.cwd, exist_ok=True)
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                str(WORKER_SCRIPT),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=self.env,
                cwd=self.cwd,
                stderr=log,
                limit=PROTOCOL_LINE_LIMIT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot run the OSWorld interpreter {self.python!r}: {exc} "
                "(fix: legato osworld install, or --osworld-python PATH)"
            ) from None
        finally:
            if log is not None:
                log.close()  # the child has its own descriptor

    async def call(self, op: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send ``{op, **fields}``; return the worker's ``result``.

        Raises ``DesktopError`` with the worker's failure kind, with kind ``transport`` when the
        worker is gone, or with the op's kind (:data:`DEADLINE_KIND`) when ``timeout`` seconds
        pass (the worker is stopped then: it may be stuck in one of DesktopEnv's sleeps).
        """
        async with self._lock:
            if not self.alive():
                raise DesktopError(
                    f"{self.name}: the OSWorld worker is not running", kind="transport"
                )
            proc = self._proc  # stop() may run meanwhile and drop self._proc
            self._next_id += 1
            rid = self._next_id
            line = json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n"
            try:
                proc.stdin.write(line)
                await proc.stdin.drain()
                raw = await asyncio.wait_for(proc.stdout.readline(), timeout)
            except asyncio.CancelledError:
                # the caller gave up (e.g. the engine's own eval deadline): the answer would
                # arrive for the next request, so this worker is done; stop() reaps it
                self._broken = True
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                    proc.send_signal(signal.SIGCONT)
                raise
            except TimeoutError:
                await self.stop(grace=5.0)
                raise DesktopError(
                    f"{self.name}: OSWorld worker {op} gave no answer within {timeout:g} s (worker stopped)",
                    kind=DEADLINE_KIND.get(op, "vm"),
                ) from None
            except (ConnectionError, BrokenPipeError, ValueError) as exc:
                raise DesktopError(
                    f"{self.name}: OSWorld worker channel broke during {op}: {exc}",
                    kind="transport",
                ) from None
            if not raw:
                code = await proc.wait()
                raise DesktopError(
                    f"{self.name}: the OSWorld worker exited ({code}) during {op} (log: {self.log_path or 'stderr'})",
                    kind="transport",
                )
            answer = json.loads(raw)
            if answer.get("id") != rid:
                await self.stop(grace=5.0)
                raise DesktopError(
                    f"{self.name}: OSWorld worker answered request {answer.get('id')} to {rid}",
                    kind="transport",
                )
            if not answer.get("ok"):
                error = answer.get("error") or {}
                kind = error.get("kind") or "vm"
                raise DesktopError(
                    f"{self.name}: {op}: {error.get('message', 'failed')}",
                    kind="transport" if kind == "protocol" else kind,
                )
            return answer.get("result") or {}

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM (the worker closes its DesktopEnv), SIGKILL after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        self._broken = False
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)  # a stopped worker gets to handle the SIGTERM
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class OSWorldDesktop(WaitsByMode):
    """One OSWorld desktop (implements :class:`~legato_pipelines.desktops.base.Desktop`).

    ``start_request`` is the worker's ``start`` request (provider, screen, cache dir, ...);
    ``vm_server`` the local desktop server this desktop owns (provider ``local``), else None.
    """

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
        self.last_start: dict[str, Any] | None = None
        self._force_revert = False
        self._last_action_fail = False
        self._http = None
        self._ready = ScreenshotReady(self._fetch_png)
        self._ready_client = None
        opts = config.options
        self.ready_mode = opts.get("ready", "screenshot")
        self.start_timeout = float(
            opts.get("start_timeout", 600.0 if start_request["provider"] == "docker" else 120.0)
        )
        self.call_timeout = float(opts.get("call_timeout", 120.0))
        self.reset_timeout = float(opts.get("reset_timeout", 300.0))

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
            request["vm_token_env"] = VM_TOKEN_ENV
            extra[VM_TOKEN_ENV] = self.vm_server.token
            headers["Authorization"] = f"Bearer {self.vm_server.token}"
        self.worker = WorkerProcess(
            self.python,
            env=worker_env(extra),
            cwd=self.work_dir,
            name=self.name,
            log_path=os.path.join(self.work_dir, f"{self.name}.log"),
        )
        await self.worker.start()
        try:
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
        if self.ready_mode == "server":
            from ..local.client import DesktopClient

            if self._ready_client is not None:
                await self._ready_client.aclose()
            self._ready_client = DesktopClient(self.vm_server.url, self.vm_server.token)
        # the clean desktop: a launch during setup counts once the screen differs from it
        await self._ready.capture_blank()

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        """Fast reset where allowed, else a snapshot revert; then the task's setup. ``"fast"`` | ``"revert"``."""
        from ...osworld_format import needs_full_reset

        revert = (
            self._force_revert
            or not self.config.fast_reset
            or task.domain in REVERT_DOMAINS
            or needs_full_reset(task)
        )
        task_config = {**task.config, "id": task.config.get("id") or task.task_id}
        self._last_action_fail = False
        self._ready.prepare(task)
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
        return self.last_reset["kind"]

    async def observe(self) -> Screenshot:
        png = base64.b64decode((await self._call("observe", self.call_timeout))["png"])
        width, height = png_size(png)
        return Screenshot(png, width, height)

    async def act(self, action: Action) -> None:
        """:func:`render_code` (``render_pyautogui`` + OSWorld's ``<`` fix) through ``DesktopEnv.step(code, pause=0)``.

        ``wait`` is OSWorld's ``WAIT`` (``step`` sleeps ``pause`` twice, so ``pause`` is half
        the wait); ``terminate`` runs nothing (the engine grades with ``last_action_fail``).
        Raises ``DesktopError(kind="act")`` when the action's code failed on the VM.
        """
        if action.action == "terminate":
            self._last_action_fail = action.status == "failure"
            return
        self._last_action_fail = False
        if action.action == "wait":
            seconds = action.seconds if action.seconds is not None else DEFAULT_WAIT_ACTION_S
            await self._call("step", self.call_timeout + seconds, code="WAIT", pause=seconds / 2)
            return
        try:
            code = render_code(action)
        except ValueError as exc:
            raise DesktopError(
                f"{self.name}: cannot render {action.action}: {exc}", kind="act"
            ) from None
        result = await self._call("step", self.call_timeout, code=code, pause=0)
        if result.get("returncode") not in (0, None):
            raise DesktopError(
                f"{self.name}: the action's pyautogui code failed on the VM "
                f"(exit {result['returncode']}): {(result.get('error') or '').strip()[-300:]}",
                kind="act",
            )

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        """``DesktopEnv.evaluate()`` (postconfig, getters, metrics) within ``eval_timeout`` s.

        An evaluator exception is ``Evaluation(0, error=reason)``; a dead VM or a hung
        evaluation raises ``DesktopError`` (kinds ``vm`` / ``evaluator``).
        """
        fail = last_action_fail or self._last_action_fail
        try:
            result = await self._call("evaluate", self.config.eval_timeout, last_action_fail=fail)
        finally:
            self._last_action_fail = False
        return Evaluation(float(result["reward"]), result.get("error"))

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
        return await self._ready.grab_frame()

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

    async def _wait(self, mode: str) -> Wait:
        """Stable screen (``reset``: after the task's setup; when the setup launched or opened
        something, the screen must first differ from the clean desktop, as the local server's
        launch wait does; heavy domains get the 0.5 s stable window)."""
        t0 = time.perf_counter()
        if not self.config.ready_signal:
            await asyncio.sleep(self.config.fixed_wait or 0.0)
            return Wait(time.perf_counter() - t0, None)
        if self.ready_mode == "server":
            result = await self._ready_client.wait(mode)
            return Wait(time.perf_counter() - t0, float(result["ready_s"]))
        result = await self._ready.wait(mode)
        return Wait(time.perf_counter() - t0, result.ready_s)


def _start_request(config: DesktopConfig, provider: str, cache_dir: Path) -> dict[str, Any]:
    opts = config.options
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
    options = dict(config.options)
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise ConfigError(
            f"desktop options {sorted(unknown)} are not osworld-backend options; allowed: {sorted(OPTION_NAMES)}"
        )
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
    requests = [_start_request(config, provider, root / f"desktop-{i}") for i in range(n)]
    for request in requests:
        request["fast_mode"] = fast_mode
        if provider == "local" and fast_mode == "vm":
            # several local desktops share one user: each keeps its baseline in its own TMPDIR
            request["baseline_dir"] = LOCAL_VM_BASELINE
    return requests


async def open_osworld_desktops(config: DesktopConfig, n: int) -> list[OSWorldDesktop]:
    """Start ``n`` osworld desktops concurrently: a worker each, DesktopEnv constructed once.

    Raises ``ConfigError`` for bad options or a missing interpreter, ``DesktopError`` when a
    desktop fails to start (the others are closed).
    """
    requests = plan_desktops(config, n)
    python = resolve_python(config)
    opts = config.options
    work_root = Path(opts.get("work_dir") or default_cache_root() / "work").expanduser().resolve()
    desktops = []
    for i, request in enumerate(requests):
        server = None
        if request["provider"] == "local":
            from ..local.backend import ServerProcess

            server = ServerProcess(
                width=config.screen_width,
                height=config.screen_height,
                user=opts.get("user"),
                template=opts.get("template"),
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
