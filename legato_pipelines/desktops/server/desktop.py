"""The ``local`` backend: :class:`LocalDesktop` drives one desktop server through its client.

Each desktop is a server process (``python -m legato_pipelines.desktops.server.main``) that
this backend starts (and restarts in ``recover()`` when it died), or a server somebody else
started (``legato desktop serve``) that it attaches to by URL. Per attempt::

    reset(task)        POST /legato/reset {full} (restores the keyboard layout too), then the
                       task's setup steps (OSWorld format)
    wait_after_reset   POST /legato/wait mode=reset       (or sleep fixed_wait), then
                       GET /legato/windows: the windows the setup produced
    observe            GET  /legato/observe?width=&height= -> Screenshot at the model's size
                       (the first one after unexpected windows are closed:
                       POST /legato/windows/close)
    act(action)        POST /legato/act                   (XTest input; never code; before
                       the first action, unexpected windows are closed again)
    wait_after_action  POST /legato/wait mode=action      (or sleep fixed_wait)
    wait_before_eval   POST /legato/wait mode=eval        (or sleep fixed_wait)
    evaluate(task)     postconfig + getters + metrics

Setup and evaluation are OSWorld's own code when an OSWorld interpreter is installed (option
``grader``, default ``auto``): an osworld worker per desktop drives this desktop's server with
desktop-env's SetupController and ``DesktopEnv.evaluate`` (:mod:`.osworld_grader`); without
one (or ``grader=own``) the project's own subset runs them (``osworld_format.run_setup`` /
``evaluate_task``). ``legato tasks check`` and the preflight judge against the same grader.

``DesktopConfig.options`` of the local backend:
  urls          list of server URLs to attach to instead of starting servers
  token_env     environment variable with the token of attached servers (default LEGATO_DESKTOP_TOKEN)
  base_port     first port of started servers (default: any free port)
  host          address started servers listen on (default 127.0.0.1)
  sandbox       run each desktop in its own sandbox (default true: namespaces, OSWorld's
                ``user`` and /home/user, sudo inside, revert in ~0.1 s; needs root); false
                runs the task's processes on the host as ``user`` with no isolation
  network       sandboxed desktops: "auto" (default: per batch, "none" when no task needs a
                network, else "own"; desktops/network.py), "none" (a loopback of its own),
                "own" (a network of its own with a route out and OSWorld's Chrome and VLC ports
                forwarded from free host ports: desktops running Chrome at once do not collide)
                or "host" (the host's, its loopback services included: logged as a warning)
  limits        sandboxed desktops' resource caps (:mod:`.limits`: a cgroup and a disk image
                per desktop): true (default: memory 4g, pids 2048, disk 8g, cpus half the
                host's CPUs and at least 1, cpu_weight and io_weight 100), an object
                overriding some (``limits='{"pids": 512}'``), or false (uncapped: the explicit
                opt-out where no cgroup can be made). A hit cap ends the attempt as a desktop
                failure of type ``resource_limit``
  user          desktop user of unsandboxed servers run as root (default legato-desktop)
  template      directory copied into each baseline HOME (pre-built app profiles)
  prebuild      apps whose pre-built profile goes into each baseline HOME (default
                ["libreoffice"] when LibreOffice is installed: built once and cached; [] none)
  cache_dir     read-only file cache for ``download`` steps and ``cloud_file`` getters
                (default: ``legato osworld cache``'s ``~/.cache/legato/osworld-files``;
                ``""``: none)
  start_timeout seconds a server may take to come up (default 30)
  grader        ``auto`` (default: OSWorld's own setup and evaluators when its venv is
                installed, else the own subset), ``osworld`` (required) or ``own``
  osworld_python the OSWorld interpreter (default: the venv of ``legato osworld install``)
  proxy         upstream proxy of the sandboxed desktops' Chromium, ``http://HOST:PORT``
                (default: environment variable LEGATO_PROXY; none); ``desktops/web.py``
  web_probe     ``HOST:PORT`` the preflight's reachability check connects to (default
                LEGATO_WEB_PROBE, else huggingface.co:443)
  web           ``live`` (default), ``record:ARCHIVE`` or ``replay:ARCHIVE``: a proxy between
                Chromium and the sites (recording: ``legato-web-recorder``; replaying:
                mitmproxy), one flow file per task (:mod:`.recorder`)
  web_hosts     ``{name: "addr[:port]"}``: sites served elsewhere (stand-ins, mirrors)
  web_ca        PEM files of CAs the desktops' Chromium and the recorder trust for sites
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...actions import Action
from ...errors import ConfigError, DesktopError
from ...images import Screenshot
from ...osworld_format import needs_full_reset
from ...osworld_format.ports import NETWORKS as PORT_NETWORKS
from ...osworld_format.sources import file_cache_dir
from ...scratch import scratch_dir
from ...tasks import Evaluation, Task
from ..base import DesktopConfig, WaitsByMode, check_options
from ..child_env import desktop_server_env
from ..client import DesktopClient
from ..network import sandbox_options, server_network
from ..osworld_worker import OSWorldGrader, template_started
from ..popups import PopupGuard
from ..processes import ForkRendezvous, PidfdProcess, Spawned, pdeathsig_guard, stop_early
from ..server_tasks import ServerTasks
from ..web import WEB_MISS_NOTE, web_server_args, web_settings
from .template import (
    GO,
    ServerTemplate,
    acquire_server_template,
    release_server_template,
    server_template_started,
)
from .wire import DEFAULT_TOKEN_ENV, READY_LINE

log = logging.getLogger(__name__)


class ServerProcess:
    """A desktop server process this process owns (its token, state directory and pid).

    The token is ``token`` if given, else random per start (``secrets.token_urlsafe(32)``);
    it is handed over in the child's environment only. Raises ``DesktopError(kind="crash")`` when the server does not
    come up within ``start_timeout`` seconds.

    ``fork``: fork the server from the desktop server template its event loop's servers share
    (:mod:`.template`: the server's imports done once) instead of spawning it; it is
    spawned anyway, with a warning, when the template cannot start or the fork fails.
    ``forked``: whether the running server came from the template (then it is the template's
    child, not ours, watched through a pidfd; its exit code is unknown).
    """

    def __init__(
        self,
        *,
        width: int,
        height: int,
        host: str = "127.0.0.1",
        port: int = 0,
        user: str | None = None,
        template: str | None = None,
        prebuild: tuple[str, ...] | None = None,
        start_timeout: float = 30.0,
        token: str | None = None,
        sandbox: bool = True,
        network: str = "none",
        ready_source: str = "damage",
        fork: bool = False,
        limits: Any = True,
        proxy: str | None = None,
        web: Any = None,
        session: str = "plain",
    ):
        self.width, self.height, self.host, self.port = width, height, host, port
        self.session = session  # the server's --session: plain | vm
        self.sandbox, self.network = sandbox, network
        self.ready_source = ready_source  # the server's --ready-source: damage | poll
        self.user, self.template, self.start_timeout = user, template, start_timeout
        self.prebuild = None if prebuild is None else tuple(prebuild)
        self.fork = fork
        self.limits = limits  # desktop option ``limits`` as given (JSON value)
        self.proxy = proxy  # Chromium's upstream proxy (desktops/web.py), checked
        self.web = web  # desktops/web.py WebSettings: mode, archive, hosts, CAs
        self.forked = False
        self.url: str | None = None
        self.ports: dict[str, int] = {}
        self._fixed_token = token
        self.token: str = token or ""
        self._token_chosen = False
        self.state_dir: Path | None = None
        self._proc: Spawned | PidfdProcess | None = None
        self._lease: ServerTemplate | None = None  # held from start() to stop()

    def __repr__(self) -> str:
        return f"ServerProcess(url={self.url!r}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and not self._proc.exited

    def choose_token(self) -> str:
        """Pick the token of the next :meth:`start` now (the fixed one, else a new random one)
        and return it: an osworld worker that will drive this server is given it while the
        server still starts."""
        import secrets

        self.token = self._fixed_token or secrets.token_urlsafe(32)
        self._token_chosen = True
        return self.token

    def server_args(self) -> list[str]:
        """The server's own arguments (after ``python -m legato_pipelines.desktops.server.main``)."""
        argv = [
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--width",
            str(self.width),
            "--height",
            str(self.height),
            "--state-dir",
            str(self.state_dir),
            "--remove-state",
            "--token-env",
            DEFAULT_TOKEN_ENV,
        ]
        if self.user:
            argv += ["--user", self.user]
        argv += ["--sandbox", "--network", self.network] if self.sandbox else ["--no-sandbox"]
        argv += ["--ready-source", self.ready_source]
        if self.session != "plain":
            argv += ["--session", self.session]
        if self.sandbox and self.limits is not True:
            argv += ["--limits", json.dumps(self.limits)]
        if self.sandbox and self.proxy:
            argv += ["--proxy", self.proxy]
        if self.sandbox and self.web is not None:
            argv += web_server_args(self.web)
        if self.template:
            argv += ["--template", str(self.template)]
        if self.prebuild is not None:  # None: the server's default
            for app in self.prebuild or ("none",):
                argv += ["--prebuild", app]
        return argv

    async def start(self) -> str:
        """Start the server; return its URL once it accepts connections. The token is the one
        :meth:`choose_token` picked for this start, else a new one (a restart never reuses
        the token of a former start unless it is fixed). Forked from the template when
        ``fork`` (class docstring), else spawned."""
        if not self._token_chosen:
            self.choose_token()
        self._token_chosen = False
        self.forked = False
        self.state_dir = Path(scratch_dir("legato-desktop-"))
        env = desktop_server_env()  # no policy key, no cloud or other credential
        env[DEFAULT_TOKEN_ENV] = self.token
        args = self.server_args()
        stdout, conn = None, None
        if self.fork:
            if self._lease is None:
                self._lease = acquire_server_template()
            try:
                stdout, conn = await self._fork_server(self._lease, args, env)
                self.forked = True
            except DesktopError as exc:
                log.warning("desktop server not forked from the template (%s); spawning it", exc)
        if stdout is None:
            stdout = await self._spawn_server(args, env)
        try:
            line = await asyncio.wait_for(stdout.readline(), self.start_timeout)
        except TimeoutError:
            await self.stop()
            raise DesktopError(
                f"desktop server did not come up within {self.start_timeout:g} s", kind="crash"
            ) from None
        except (ConnectionError, OSError):
            line = b""
        finally:
            if conn is not None:
                conn.close()  # the READY line is all a forked server says there
        if not line.startswith(READY_LINE.encode()):
            try:  # a forked server's stdout is a socket: a broken one is no proof of its end
                code = await asyncio.wait_for(self._proc.wait(), self.start_timeout)
            except TimeoutError:
                code = None
            await self.stop()
            raise DesktopError(
                f"desktop server {_exit_text(code)} before it was ready (see its stderr above)",
                kind="crash",
            )
        ready = json.loads(line[len(READY_LINE) :])
        self.url = ready["url"]
        # host ports of the desktop's CDP bridge and VLC ({"chromium", "vlc"}, as DesktopEnv
        # names them; Session.osworld_ports)
        self.ports = ready.get("ports") or {}
        return self.url

    async def _spawn_server(self, args: list[str], env: dict[str, str]) -> asyncio.StreamReader:
        """Spawn the server (``python -m legato_pipelines.desktops.server.main``); its stdout."""
        # A parent-death signal: if this process dies (even by SIGKILL), the server gets SIGTERM
        # and shuts its desktop down instead of leaking it.
        guard = pdeathsig_guard()
        argv = [*guard, sys.executable, "-m", "legato_pipelines.desktops.server.main", *args]
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.PIPE, start_new_session=True
        )
        self._proc = Spawned(proc)
        return proc.stdout

    async def _fork_server(
        self, template: ServerTemplate, args: list[str], env: dict[str, str]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Fork the server from ``template``; its stdout (the streams of a connection to a Unix
        socket in a private directory; the child waits for :data:`.template.GO` on it
        before it runs the server, so a child whose start was given up exits). Raises ``DesktopError(kind="transport")``
        when the template is not there, refuses, or the child does not connect within
        ``start_timeout``; the child, if any, is killed then."""
        if not await template.ready():
            raise DesktopError("the template did not start", kind="transport")
        try:
            async with ForkRendezvous("legato-srvfork-") as meeting:
                pid = await template.fork(socket=meeting.path, argv=args, env=env)
                conn = await meeting.accept(pid, self.start_timeout, "the forked server")
                try:
                    await asyncio.get_running_loop().sock_sendall(conn, GO)  # run it now
                    reader, writer = await asyncio.open_unix_connection(sock=conn)
                except BaseException:
                    conn.close()
                    raise
                self._proc = PidfdProcess(pid, meeting.adopt())
                return reader, writer
        except (TimeoutError, OSError, ValueError) as exc:
            raise DesktopError(
                f"forking from the template failed: {type(exc).__name__}: {exc}",
                kind="transport",
            ) from None

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (graceful: the server kills its desktop), SIGKILL after ``timeout`` s;
        remove its state; give back the lease on the template once the server has ended."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and not proc.exited:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), timeout)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        finally:
            if self.state_dir is not None:
                from .limits import release_disk

                release_disk(self.state_dir)  # a killed server's disk image (limits.py)
                shutil.rmtree(self.state_dir, ignore_errors=True)
                self.state_dir = None
            lease, self._lease = self._lease, None
            if lease is not None:
                await release_server_template(lease)

    def kill(self) -> None:
        """SIGKILL the server (tests use it to simulate a crash)."""
        if self._proc is not None and not self._proc.exited:
            self._proc.kill()


def _exit_text(code: int | None) -> str:
    """``exited with <code>``, or ``exited`` for a forked server, whose code is unknown here."""
    return "exited" if code is None else f"exited with {code}"


class LocalDesktop(PopupGuard, ServerTasks, WaitsByMode):
    """One local desktop (implements :class:`~legato_pipelines.desktops.base.Desktop`).

    ``client`` talks to the server; ``server`` is the process this object owns, or ``None``
    when attached to a URL (then ``recover()`` is a full reset plus a health check);
    ``grader``: the osworld worker that runs the task's setup and evaluation with OSWorld's
    own code (:mod:`.osworld_grader`), or ``None`` for the own subset.
    """

    observe_resizes = True  # the server hands out the model-size PNG (base.py)

    def __init__(
        self,
        name: str,
        client: DesktopClient,
        config: DesktopConfig,
        screen_size: tuple[int, int],
        *,
        server: ServerProcess | None = None,
        grader: OSWorldGrader | None = None,
    ):
        super().__init__(name, client, config, screen_size)
        self.server = server
        self.grader = grader
        self.last_reset: dict[str, Any] | None = None
        self._force_full = False
        self._guard_reset()
        # servers this backend starts are sandboxed unless sandbox=false; attached ones may not be
        self.sandboxed = server is not None and config.options.get("sandbox", True) is True

    # -- Desktop protocol ----------------------------------------------------------------------

    async def reset(self, task: Task, *, seed: int = 0) -> str:
        """Server reset (fast where allowed), then the task's setup steps. ``"fast"`` | ``"revert"``.

        ``seed`` is ignored: a real desktop has no randomness of its own to seed.
        """
        # A sandboxed server reverts by itself when the task wrote outside HOME (the overlay's
        # upper layer is not empty), so tasks that do need no full restart up front.
        outside = needs_full_reset(task) and not self.sandboxed
        full = self._force_full or not self.config.fast_reset or outside
        self._guard_reset()
        self.last_reset = await self.client.reset(full=full)
        self._force_full = False
        if self.web_mode != "live":  # the recorder's attempt, before the setup opens a site
            await self.client.web_begin(task.task_id)
        if self.last_reset.get("keyboard_restored"):  # an earlier attempt switched the layout
            self.reset_facts["keyboard_restored"] = self.last_reset["keyboard_restored"]
        if self.grader is not None:
            self.setup_failures = []
            try:
                self.setup_failures = await self.grader.setup(task)
            except DesktopError:
                self._force_full = True
                raise
        else:
            await self._run_task_setup(task)
        return "fast" if self.last_reset["kind"] == "fast" else "revert"

    async def observe(self, size: tuple[int, int] | None = None) -> Screenshot:
        """The screen; at the model's ``size`` (width, height) when given, resized by the
        desktop server in its own process (``/legato/observe?width=&height=``); the first
        one after a reset only once unexpected windows are closed
        (:class:`~legato_pipelines.desktops.popups.PopupGuard`)."""
        await self._guard_handout()
        return await self.client.observe(size)

    async def act(self, action: Action) -> None:
        """XTest input on the server; ``wait`` sleeps here. Before the policy's first action
        of the attempt, windows that appeared since the reset are closed first."""
        await self._guard_first_action()
        if action.action == "wait":
            await asyncio.sleep(self.config.waits.wait_action(action))
            return
        await self.client.act(action)

    async def evaluate(self, task: Task, *, last_action_fail: bool = False) -> Evaluation:
        """Postconfig + OSWorld getters/metrics, within ``eval_timeout`` seconds.

        ``last_action_fail``: the agent's last action was FAIL (OSWorld ``infeasible``).
        Raises ``DesktopError(kind="evaluator")`` when the evaluation hangs.
        """
        try:
            if self.grader is not None and task.evaluator:  # none: the own path says so
                graded = await self.grader.evaluate(
                    last_action_fail=last_action_fail, timeout=self.config.eval_timeout
                )
            else:
                graded = await self._grade(task, last_action_fail)
            return await self._web_notes(graded)
        except DesktopError:
            self._force_full = True  # a hung evaluation may leave the desktop in any state
            raise

    def take_grader_log(self) -> bytes | None:
        """What OSWorld's grader wrote for the last attempt (its setup and evaluation), for the
        run directory (``OSWorldGrader.take_grader_log``); ``None`` with the own subset (it
        runs in the collector: its logging is the collector's)."""
        return self.grader.take_grader_log() if self.grader is not None else None

    async def recover(self) -> None:
        """Make the desktop usable again: restart an owned server that died or does not answer,
        else a full restart of its display; raise ``DesktopError(kind="crash")`` if that fails."""
        self._force_full = False
        if self.server is not None and not await self._healthy():
            await self.client.aclose()
            await self.server.stop()
            await self.server.start()
            self.client = DesktopClient(self.server.url, self.server.token)
            if self.grader is not None:
                self.grader.ports = self.server.ports  # --network own: new host ports
                await self.grader.start(self.server.url, self.server.token)
        try:
            await self.client.reset(full=True)
            health = await self.client.health()
        except DesktopError as exc:
            raise DesktopError(f"{self.name}: recovery failed: {exc}", kind="crash") from None
        if not health.get("ok"):
            raise DesktopError(
                f"{self.name}: recovery failed: the display is not up after a full restart",
                kind="crash",
            )

    async def close(self) -> None:
        if self.grader is not None:
            await self.grader.close()
        await self.client.aclose()
        if self.server is not None:
            await self.server.stop()
        self._drop_work_dir()

    # -- helpers -------------------------------------------------------------------------------

    @property
    def web_mode(self) -> str:
        """``live``, ``record`` or ``replay`` (desktop option ``web``; servers this backend
        started only)."""
        if self.server is None or not self.sandboxed:
            return "live"
        return str(self.config.options.get("web") or "live").partition(":")[0]

    async def _web_notes(self, graded: Evaluation) -> Evaluation:
        """``graded`` with the replay's misses as a note (``web_replay_missing: N request(s)
        not in the archive, by host: HOST n, ...; first: METHOD URL``), a fact of the attempt
        the profile counts."""
        if self.web_mode != "replay":
            return graded
        misses = await self.client.web_misses()
        if not misses:
            return graded
        hosts = Counter(urlsplit(m["url"]).hostname or "?" for m in misses)
        by_host = ", ".join(f"{host} {n}" for host, n in hosts.most_common(5))
        first = f"{misses[0]['method']} {misses[0]['url'][:200]}"
        note = (
            f"{WEB_MISS_NOTE}: {len(misses)} request(s) not in the archive, by host: {by_host};"
            f" first: {first}"
        )
        return dataclasses.replace(graded, notes=(*graded.notes, note))

    async def _list_windows(self) -> list[dict[str, Any]] | None:
        return await self.client.windows()  # None from an older server: the guard is off

    async def _close_windows(self, ids: list[Any]) -> dict[Any, str]:
        return await self.client.close_windows(ids)

    async def _ready(self, mode: str, cap_s: float) -> tuple[float, bool, bool]:
        if mode == "reset":  # an app the setup launched: its main window, within its own cap
            app_window_s = self.config.waits.ready_app_window_s
            result = await self.client.wait(mode, timeout_s=cap_s, app_window_s=app_window_s)
        else:
            result = await self.client.wait(mode, timeout_s=cap_s)
        return float(result["ready_s"]), bool(result.get("timed_out")), bool(result.get("undrawn"))

    async def _healthy(self) -> bool:
        if self.server is not None and not self.server.alive():
            return False
        try:
            return bool((await self.client.health(timeout=5.0)).get("ok"))
        except DesktopError:
            return False


#: Sandboxed desktops' networks (``legato desktop serve --network``, desktop option
#: ``network``): what each does to OSWorld's ports, ``osworld_format/ports.py``.
NETWORKS = PORT_NETWORKS


def server_numbers(options: dict[str, Any]) -> tuple[int | None, float]:
    """``(base_port, start_timeout)`` from desktop options ``base_port`` (a port 1-65535 the
    ``n``-th server adds ``n`` to; default ``None``: any free port) and ``start_timeout``
    (seconds > 0 a server may take to come up; default 30). Raises ``ConfigError`` naming the
    option and the fix: checked in the preflight (:func:`..support.backend_support`), before
    anything of a run is written."""
    base_port, start_timeout = options.get("base_port"), options.get("start_timeout", 30.0)
    try:
        port = None if base_port in (None, "") else int(base_port)
    except (TypeError, ValueError):
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(
            f"desktop option 'base_port' must be a port number 1-65535, got {base_port!r} "
            "(fix: --desktop-option base_port=8100, or leave it out for any free port)"
        )
    try:
        timeout = float(start_timeout)
    except (TypeError, ValueError):
        timeout = -1.0
    if not timeout > 0:
        raise ConfigError(
            f"desktop option 'start_timeout' must be seconds > 0, got {start_timeout!r} "
            "(fix: --desktop-option start_timeout=60)"
        )
    return port, timeout


async def open_local_desktops(config: DesktopConfig, n: int, first: int = 0) -> list[LocalDesktop]:
    """Start ``n`` desktop servers concurrently (or attach to ``options["urls"]``), named
    ``local-<first>`` on.

    When OSWorld's grader is used, each desktop's osworld worker is spawned and imports
    desktop_env (:meth:`.OSWorldGrader.spawn`) while its server starts, and is attached to it
    once the server is up: start-up is the longer of the two, not their sum.

    Raises ``ConfigError`` for unknown options, too few URLs or a missing token variable, and
    ``DesktopError(kind="crash")`` when a server or a grader does not come up (the others are
    stopped).
    """
    check_options(config)
    options = dict(config.options)
    if n < 1:
        raise ConfigError(f"desktops must be >= 1, got {n}")
    sandbox, network = sandbox_options(options)
    urls = options.get("urls")
    if urls:
        return await _attach(config, list(urls), n, options.get("token_env", DEFAULT_TOKEN_ENV))
    python = _grader_python(options)
    prebuild = prebuild_option(options.get("prebuild"))
    base_port, start_timeout = server_numbers(options)
    size = (config.screen_width, config.screen_height)
    servers, graders = [], []
    for i in range(first, first + n):
        server = ServerProcess(
            width=config.screen_width,
            height=config.screen_height,
            host=options.get("host", "127.0.0.1"),
            port=(base_port + i) if base_port else 0,
            user=options.get("user"),
            template=options.get("template"),
            prebuild=prebuild,
            start_timeout=start_timeout,
            sandbox=sandbox,
            network=server_network(network),
            limits=limits_option(options.get("limits", True)),
            proxy=web_settings(options).proxy,
            web=web_settings(options),
            session=session_option(options.get("session")),
            fork=True,  # from the template all servers of this event loop share
        )
        token = server.choose_token()
        servers.append(server)
        graders.append(
            None if python is None else _grader(f"local-{i}", python, "", token, size, options)
        )

    async def stop_all() -> None:
        await asyncio.gather(
            *(g.close() for g in graders if g is not None),
            *(s.stop() for s in servers),
            return_exceptions=True,
        )

    try:
        started = await asyncio.gather(
            *(_start(s, g) for s, g in zip(servers, graders, strict=True)),
            return_exceptions=True,
        )
    except BaseException:  # cancelled (a batch that ended before its late spares were up)
        await stop_all()
        raise
    failures = [r for r in started if isinstance(r, BaseException)]
    if failures:
        await stop_all()
        broken = [f for f in failures if not isinstance(f, _GraderFailed)]
        if broken:
            raise DesktopError(
                f"{len(broken)} of {n} desktop servers failed to start: {broken[0]}",
                kind="crash",
            )
        raise DesktopError(
            f"{len(failures)} of {n} OSWorld graders failed to start: {failures[0].error} "
            "(fix: `legato osworld install`, or desktop option grader=own)",
            kind="crash",
        )
    return [
        LocalDesktop(f"local-{i}", DesktopClient(s.url, s.token), config, size, server=s, grader=g)
        for i, s, g in zip(range(first, first + n), servers, graders, strict=True)
    ]


class _GraderFailed(Exception):
    """A desktop's osworld worker did not come up (``error``: its ``DesktopError``)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


async def _start(server: ServerProcess, grader: OSWorldGrader | None) -> None:
    """Start ``server`` and, at the same time, spawn ``grader``'s worker (the desktop_env
    import); attach the grader once the server is up. Raises the server's ``DesktopError``,
    or :class:`_GraderFailed` when only the grader failed."""
    if grader is None:
        await server.start()
        return
    up, spawned = await asyncio.gather(server.start(), grader.spawn(), return_exceptions=True)
    if isinstance(up, BaseException):  # the server's failure first: it names the cause
        raise up
    if isinstance(spawned, BaseException):
        raise _GraderFailed(spawned)
    grader.ports = server.ports  # --network own: the forwarded host ports
    try:
        await grader.start(server.url, server.token)
    except DesktopError as exc:
        raise _GraderFailed(exc) from None


@contextlib.asynccontextmanager
async def warm_up_local(config: DesktopConfig, evaluators: Sequence[dict] = ()):
    """``desktops.warm_up`` for local desktops: started in the background for the block, the
    template the desktop servers are forked from (:mod:`.template`; not for servers
    attached by URL) and, when option ``grader`` picks OSWorld's code, the OSWorld graders'
    template (:func:`~legato_pipelines.desktops.osworld_worker.template_started`, given the batch's
    ``evaluators``, whose modules it imports before its first fork); each takes over
    the one ``legato`` started on its first line when there is one (``desktops/early.py``),
    and one started there that neither took is stopped. Raises ``ConfigError`` as
    :func:`_grader_python`."""
    python = _grader_python(dict(config.options))
    async with contextlib.AsyncExitStack() as stack:
        if not config.options.get("urls"):  # servers started here: forked from their template
            await stack.enter_async_context(server_template_started())
        if python is not None:
            await stack.enter_async_context(template_started(str(python), evaluators))
        await asyncio.sleep(0)  # the starts take the templates legato began on its first line
        stop_early()  # ... and any other it began, read from the command line otherwise
        yield


def limits_option(value: Any) -> Any:
    """Desktop option ``limits`` checked (:func:`.limits.parse_caps`) and returned as given.
    Raises ``ConfigError`` naming the option and the fix."""
    from .limits import parse_caps

    try:
        parse_caps(value)
    except ValueError as exc:
        raise ConfigError(f"desktop option {exc}") from None
    return value


def session_option(value: Any) -> str:
    """Desktop option ``session``: ``plain`` (absent: openbox on black) or ``vm`` (the look of
    OSWorld's VM, docs/local-desktop.md §18). Raises ``ConfigError`` naming the option, the
    choices, or the packages ``vm`` needs here."""
    from .vm_look import check_session

    try:
        return check_session("plain" if value is None else str(value))
    except ValueError as exc:
        raise ConfigError(f"desktop option 'session': {exc}") from None


def prebuild_option(value: Any) -> tuple[str, ...] | None:
    """Desktop option ``prebuild``: ``None`` (absent: the server's default, LibreOffice's
    profile when it is installed) or a list of apps (:data:`.session.PREBUILD_APPS`; ``[]``:
    none). Raises ``ConfigError`` naming the option."""
    from .session import PREBUILD_APPS

    if value is None:
        return None
    if not isinstance(value, list | tuple) or any(app not in PREBUILD_APPS for app in value):
        raise ConfigError(
            f"desktop option 'prebuild' must be a list of {', '.join(PREBUILD_APPS)} "
            f"(e.g. prebuild='[\"libreoffice\"]', or [] for none), got {value!r}"
        )
    return tuple(value)


def _grader_python(options: dict[str, Any]):
    """The OSWorld interpreter the graders run under, ``None`` for the own subset (option
    ``grader``; :func:`~legato_pipelines.desktops.osworld_worker.grader.local_grader`). Raises
    ``ConfigError`` when option ``grader``/``osworld_python`` names what is not there."""
    from ..osworld_worker import local_grader

    return local_grader(options)[1]


def _grader(
    name: str,
    python,
    url: str,
    token: str,
    size: tuple[int, int],
    options: dict[str, Any],
) -> OSWorldGrader:
    """The osworld worker of desktop ``name`` (not started), forked from the template its
    interpreter's graders share (``osworld_worker/template.py``: desktop_env is imported once)."""
    return OSWorldGrader(
        name=name,
        python=str(python),
        url=url,
        token=token,
        screen_size=size,
        cache_dir=file_cache_dir(options),
        template=True,
    )


async def _with_graders(
    desktops: list[LocalDesktop], tokens: list[str], options: dict[str, Any]
) -> list[LocalDesktop]:
    """Attach an OSWorld grader to each of the already-running ``desktops`` (attached by URL)
    when option ``grader`` picks OSWorld's code; start them concurrently. On a failure every
    desktop is closed and ``DesktopError`` raised."""
    try:
        python = _grader_python(options)
    except ConfigError:
        await asyncio.gather(*(d.close() for d in desktops), return_exceptions=True)
        raise
    if python is None:
        return desktops
    for desktop, token in zip(desktops, tokens, strict=True):
        desktop.grader = _grader(
            desktop.name, python, desktop.client.url, token, desktop.screen_size, options
        )
        if desktop.server is not None:
            desktop.grader.ports = desktop.server.ports
    started = await asyncio.gather(*(d.grader.start() for d in desktops), return_exceptions=True)
    failures = [r for r in started if isinstance(r, BaseException)]
    if failures:
        await asyncio.gather(*(d.close() for d in desktops), return_exceptions=True)
        raise DesktopError(
            f"{len(failures)} of {len(desktops)} OSWorld graders failed to start: {failures[0]} "
            "(fix: `legato osworld install`, or desktop option grader=own)",
            kind="crash",
        )
    return desktops


async def _attach(
    config: DesktopConfig, urls: list[str], n: int, token_env: str
) -> list[LocalDesktop]:
    if len(urls) < n:
        raise ConfigError(
            f"desktop option 'urls' lists {len(urls)} servers but {n} desktops are to be opened "
            "(one server per runner and per spare)"
        )
    token = os.environ.get(token_env, "")
    if not token:
        raise ConfigError(
            f"attaching to desktop servers needs their token in the environment variable {token_env}"
        )
    clients = [DesktopClient(url, token) for url in urls[:n]]
    try:
        healths = await asyncio.gather(*(c.health(timeout=10.0) for c in clients))
    except DesktopError:
        await asyncio.gather(*(c.aclose() for c in clients))
        raise
    desktops = [
        LocalDesktop(f"local-{i}", c, config, (int(h["width"]), int(h["height"])))
        for i, (c, h) in enumerate(zip(clients, healths, strict=True))
    ]
    return await _with_graders(desktops, [token] * len(desktops), dict(config.options))
