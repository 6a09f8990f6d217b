"""OSWorld VM servers attached by URL: desktops driven through OSWorld's base API only.

An OSWorld VM's own in-VM server (``desktop_env/server/main.py``, Flask on port 5000,
docs/osworld.md §2) has no token and none of legato's ``/legato/`` endpoints. The remote pool
(:mod:`.remote`) probes ``GET /legato/health`` once at attach; a 404/405 means such a plain
server, and the URL becomes a :class:`VMServerDesktop`. Per attempt::

    reset(task)        POST /setup/execute: kill the apps of the task's domain and of the
                       previous task's domain, verify none survived,
                       restore the HOME baseline captured at attach (docs/osworld.md §6), then the
                       task's setup steps (osworld_format.run_setup over the base API)
    wait_after_reset   poll GET /screenshot until stable   (or sleep fixed_wait), then the
                       windows the setup produced (``wmctrl -lx`` over /execute)
    observe            GET /screenshot -> Screenshot (the first one once windows nobody asked
                       for are closed: ``wmctrl -ic``, ``xkill``; again before the first action)
    act(action)        POST /execute ["python", "-c", "import pyautogui; import time;
                       pyautogui.FAILSAFE = False; <code>"], as OSWorld's DesktopEnv.step runs
                       it; <code> is render_osworld_code(action) (escaped pyautogui from the structured
                       action, never model text; text pyautogui cannot type goes through XTest,
                       what still fails is the action's ``not_typed``); ``wait`` sleeps
    wait_after_action  poll GET /screenshot until stable   (or sleep fixed_wait)
    wait_before_eval   poll GET /screenshot until stable   (or sleep fixed_wait)
    evaluate(task)     postconfig + getters + metrics over the base API (osworld_format.evaluate_task)
    recover()          wait up to ``reconnect_s`` seconds for the server to answer again

What does not work through the server alone: a snapshot revert. Tasks that need one
(``os``/``multi_apps`` domains, state outside HOME per :func:`needs_full_reset`, or
``DesktopConfig.fast_reset=False``) raise ``DesktopError(kind="vm")`` at reset; run them on
the ``osworld`` backend, which owns the VM. The desktop needs a ``python`` with pyautogui on
its PATH for ``/execute`` (OSWorld's VM image has one; ``scripts/osworld_venv.sh`` for a
local desktop). The HOME it restores is the one it found at attach, so attach to a clean VM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...actions import Action
from ...errors import DesktopError
from ...images import Screenshot
from ...osworld_format import needs_full_reset
from ...tasks import Evaluation, Task
from ..base import DesktopConfig, WaitsByMode, act_facts, osworld_code, screenshot_of
from ..client import DesktopClient
from ..domains import REVERT_DOMAINS, baseline_script, domain_processes, fast_reset_script
from ..popups import PopupGuard, WmctrlWindows
from ..ready import ScreenshotReady
from ..reconnect import reconnect
from ..server_tasks import ServerTasks

log = logging.getLogger("legato_pipelines.desktops.server.vmserver")

#: What OSWorld's ``PythonController.execute_python_command`` puts before an action's code.
PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
#: Where the clean HOME is kept on the desktop: its TMPDIR when set (a local desktop server
#: gives each desktop its own), else /var/tmp (a VM). Expanded by the desktop's shell.
BASELINE_DIR = "${TMPDIR:-/var/tmp}/legato-home-baseline"
PROBE_TIMEOUT_S = 5.0
RESET_SCRIPT_TIMEOUT_S = 60.0
REVERT_MESSAGE = (
    "this desktop is an OSWorld VM server attached by URL; snapshot revert needs the "
    "osworld backend (which owns the VM)"
)


def execute_argv(code: str) -> list[str]:
    """The ``/execute`` command of one action's pyautogui ``code`` (OSWorld's DesktopEnv.step)."""
    return ["python", "-c", PYAUTOGUI_PREFIX + code]


class VMServerDesktop(PopupGuard, ServerTasks, WaitsByMode):
    """One desktop behind a plain OSWorld in-VM server at ``client.url`` (implements
    :class:`~legato_pipelines.desktops.base.Desktop`). Make it with :func:`attach_vm_server`.

    ``reconnect_s``: seconds ``recover()`` waits for the server to answer again.
    """

    def __init__(
        self,
        name: str,
        client: DesktopClient,
        config: DesktopConfig,
        screen_size: tuple[int, int],
        *,
        reconnect_s: float,
    ):
        super().__init__(name, client, config, screen_size)
        self.reconnect_s = reconnect_s
        self.last_reset: dict[str, float] | None = None
        self._ready_signal = ScreenshotReady(self.client.screenshot)
        self._last_domain: str | None = None  # the previous task's apps are killed as well
        self._windows = WmctrlWindows(lambda argv: self.client.execute(argv, timeout=10.0))
        self._guard_reset()

    # -- attach ------------------------------------------------------------------------------------

    async def attach(self) -> None:
        """Snapshot the clean HOME into the baseline and remember the clean screen.

        Raises ``DesktopError(kind="vm")`` when the server cannot run the baseline script.
        """
        out = await self.client.setup_execute(
            ["bash", "-c", baseline_script(BASELINE_DIR)], timeout=RESET_SCRIPT_TIMEOUT_S
        )
        if out.get("returncode") != 0:
            raise DesktopError(
                f"{self.name}: cannot keep a HOME baseline on the VM server: "
                f"{(out.get('output') or '')[-200:]}{(out.get('error') or '')[-200:]}".strip(),
                kind="vm",
            )
        await self._ready_signal.capture_blank()

    # -- Desktop protocol ----------------------------------------------------------------------

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        """Fast reset through ``/setup/execute``, then the task's setup; returns ``"fast"``.

        ``seed`` is ignored. Raises ``DesktopError``: kind ``crash`` when the server does not
        answer, ``vm`` when the task needs a snapshot revert (see the module docs) or the
        fast reset failed (an app survived, no baseline), ``setup`` from the task's setup.
        """
        if not self.config.fast_reset or task.domain in REVERT_DOMAINS or needs_full_reset(task):
            why = (
                "fast_reset is off"
                if not self.config.fast_reset
                else f"domain {task.domain!r} changes state outside HOME"
                if task.domain in REVERT_DOMAINS
                else "it changes state outside HOME"
            )
            raise DesktopError(
                f"{self.name}: task {task.task_id!r} needs a snapshot revert ({why}): {REVERT_MESSAGE}",
                kind="vm",
            )
        self._guard_reset()
        await self._probe("before the attempt")
        t0 = time.perf_counter()
        kill = set(domain_processes(task.domain))
        if self._last_domain is not None:
            kill |= set(domain_processes(self._last_domain))
        out = await self.client.setup_execute(
            ["bash", "-c", fast_reset_script(kill, BASELINE_DIR, same_display=True)],
            timeout=RESET_SCRIPT_TIMEOUT_S,
        )
        if out.get("returncode") != 0:
            raise DesktopError(
                f"{self.name}: fast reset on the VM server failed (exit {out.get('returncode')}): "
                f"{((out.get('output') or '') + (out.get('error') or '')).strip()[-300:]}",
                kind="vm",
            )
        clean_s = time.perf_counter() - t0
        self._last_domain = task.domain
        self._ready_signal.prepare(task)
        await self._run_task_setup(task)
        self.last_reset = {"clean_s": clean_s, "reset_s": time.perf_counter() - t0}
        return "fast"

    async def observe(self) -> Screenshot:
        """``GET /screenshot`` (the first after a reset once unexpected windows are closed:
        :mod:`.popups`); raises ``DesktopError(kind="observe")`` for a non-PNG answer."""
        await self._guard_handout()
        return screenshot_of(await self.client.screenshot(), self.name)

    async def act(self, action: Action) -> dict[str, Any] | None:
        """One action as OSWorld's DesktopEnv.step runs it (see the module docs).

        Returns ``{"not_typed": chars}`` when a ``type`` could not type some characters
        (:func:`~legato_pipelines.desktops.base.act_facts`), else ``None``. Raises
        ``DesktopError(kind="act")`` when the action cannot be rendered or its code failed on
        the desktop (e.g. no ``python`` with pyautogui there).
        """
        await self._guard_first_action()
        if action.action == "wait":
            await asyncio.sleep(self.config.waits.wait_action(action))
            return None
        code = osworld_code(action, self.name)
        out = await self.client.execute(
            execute_argv(code), timeout=self.config.waits.execute_timeout_s
        )
        if out.get("returncode") != 0:
            raise DesktopError(
                f"{self.name}: the action's pyautogui code failed on the desktop "
                f"(exit {out.get('returncode')}): {(out.get('error') or '').strip()[-300:]}",
                kind="act",
            )
        return act_facts(action, out.get("output"))

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        """Postconfig + OSWorld getters/metrics over the base API, within ``eval_timeout`` s.

        ``last_action_fail``: the agent's last action was FAIL (OSWorld ``infeasible``).
        Raises ``DesktopError(kind="evaluator")`` when the evaluation hangs.
        """
        return await self._grade(task, last_action_fail)

    async def recover(self) -> None:
        """Wait up to ``reconnect_s`` seconds for the server to answer (the next reset cleans
        the desktop); raise ``DesktopError(kind="crash")`` when it does not (the desktop is lost)."""
        await reconnect(self.name, lambda: self._probe("during recovery"), self.reconnect_s)

    async def close(self) -> None:
        await self.client.aclose()
        self._drop_work_dir()

    # -- helpers -------------------------------------------------------------------------------

    async def _probe(self, when: str) -> None:
        try:
            await asyncio.wait_for(self.client.platform(), PROBE_TIMEOUT_S)
        except (DesktopError, TimeoutError) as exc:
            raise DesktopError(
                f"{self.name}: VM server does not answer {when}: {exc or 'timeout'}", kind="crash"
            ) from None

    async def _ready(self, mode: str, cap_s: float) -> tuple[float, bool]:
        result = await self._ready_signal.wait(mode, timeout_s=cap_s)
        return result.ready_s, result.timed_out

    async def _list_windows(self) -> list[dict[str, Any]] | None:
        return await self._windows.list()

    async def _close_windows(self, ids: list[Any]) -> dict[Any, str]:
        return await self._windows.close(ids)


async def attach_vm_server(
    url: str, name: str, config: DesktopConfig, *, reconnect_s: float
) -> VMServerDesktop:
    """A :class:`VMServerDesktop` for the plain OSWorld server at ``url`` (no token is sent):
    its screen size from ``/screen_size``, its HOME baseline taken now.

    Raises ``DesktopError`` when the server does not answer or cannot keep a baseline (the
    client is closed then).
    """
    client = DesktopClient(url, None)
    try:
        size = await client.screen_size()
        desktop = VMServerDesktop(name, client, config, size, reconnect_s=reconnect_s)
        await desktop.attach()
    except BaseException:
        await client.aclose()
        raise
    return desktop
