"""The state behind a local desktop server's routes: the session, its X thread, the pending
launch and the operations several routes share (reset, the ready wait, performing an action).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace

import numpy as np
from starlette.requests import Request

from ...actions import Action
from ..ready import (
    HEAVY_APPS,
    MODES,
    Activity,
    Delta,
    ReadyResult,
    policy_for,
    wait_until_ready,
)
from . import apps, drawn
from .app_windows import is_main_window, owners_known, window_pids
from .keymap import KeyboardState, keyboard_state, restore_keyboard
from .prepared_obs import PreparedObservations
from .procs import descendants, ended, own_process_table
from .session import Session, SessionError
from .wire import READY_SOURCES  # damage (poll where the X server has no DAMAGE) | poll
from .xstate import XState, restore, snapshot
from .xthread import XThread

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 1.0
CLOSE_GRACE_S = 1.0  # seconds a window may take to close when asked, before its client is killed
#: A launched app that ends this soon (s), failing or leaving nothing running, is reported
#: (``xterm -e false`` ends after ~50 ms under the sandbox).
LAUNCH_CHECK_S = 0.2
#: ... but a launch is settled after this long (s) once the app has a child of its own that
#: runs (xterm's shell, LibreOffice's soffice.bin): the usual launch returns this soon.
LAUNCH_SETTLED_S = 0.05
EXISTS_TIMEOUT_S = 10.0  # seconds for the ``test -e`` of an ``open`` step
#: Seconds between looks at the Ctrl+Alt+T grab (:mod:`.hotkeys`) outside action waits
#: (a key pressed by a command the task runs, e.g. pyautogui through ``/execute``).
HOTKEY_POLL_S = 0.1
APP_WINDOW_POLL_S = 0.1  # seconds between looks for a launched app's main window
#: At most this long (s) a launch of a quick windowed program (:data:`~.apps.QUICK_WINDOWED_PROGRAMS`)
#: waits for a new managed main window before answering; looked for every
#: :data:`LAUNCH_WINDOW_POLL_S` (:meth:`DesktopServer.window_after_launch`).
LAUNCH_WINDOW_S = 1.0
LAUNCH_WINDOW_POLL_S = 0.02
#: Seconds between looks at a launched app's content (:meth:`DesktopServer.undrawn_apps`).
CONTENT_POLL_S = 0.1


@dataclass
class LaunchMark:
    """What the screen looked like when the last app was launched (for the launch ready wait)."""

    frame: np.ndarray
    windows: frozenset[int]


@dataclass
class LaunchedApp:
    """An app launched since the reset (``/setup/launch``, ``/setup/open_file``, Ctrl+Alt+T):
    the program (:func:`~.apps.program_of`) and the host pids of its process tree seen so far
    (kept when a process is reparented, e.g. a daemonizing launcher's child). ``settled``:
    it had a main window, or a wait for one ran out; it is not waited for again. ``drawn``: its
    main window showed content and the app stopped loading (:meth:`DesktopServer.undrawn_apps`),
    or a wait for that ran out; ``busy``: (monotonic time, {pid: busy seconds}) when idle time
    started counting."""

    program: str
    pids: set[int] = field(default_factory=set)
    settled: bool = False
    drawn: bool = False
    busy: tuple[float, dict[int, float]] | None = None


#: Routes that neither act on the desktop nor start anything on it: between an action wait
#: and the ``eval`` wait only these keep the quiet credit (``DesktopServer.quiet_mark``).
READ_ONLY_ROUTES = frozenset(
    {
        "/screenshot",
        "/legato/observe",
        "/legato/wait",
        "/legato/health",
        "/legato/web",  # the web recorder: nothing of the desktop changes
        "/legato/processes",
        "/legato/windows",
        "/platform",
        "/screen_size",
        "/cursor_position",
        "/terminal",
        "/accessibility",
        "/desktop_path",
    }
)


class DesktopServer:
    """The state behind the routes: the session, its X thread and the pending launch."""

    def __init__(
        self, session: Session, *, remove_state: bool = False, ready_source: str = "damage"
    ):
        """``ready_source``: the default source of the ready wait, one of
        :data:`READY_SOURCES` (raises ``ValueError`` otherwise)."""
        if ready_source not in READY_SOURCES:
            raise ValueError(f"ready_source must be one of {READY_SOURCES}, got {ready_source!r}")
        self.session = session
        #: the web recorder of desktop option ``web`` record/replay (:mod:`.recorder`), or None
        self.recorder = None
        self.remove_state = remove_state
        self.ready_source = ready_source
        self.x = XThread(session)
        self.reset_lock = asyncio.Lock()
        self.launch_mark: LaunchMark | None = None
        self.before_action: np.ndarray | None = None  # the screen just before the last action
        self.keyboard_baseline: KeyboardState | None = None  # the layout at start (keymap.py)
        self.x_baseline: XState | None = None  # the X server's state at start (xstate.py)
        self.heavy = False  # a heavy app (ready.HEAVY_APPS) ran at the last look
        self._heavy_refresh: asyncio.Task | None = None
        self._reaper: asyncio.Task | None = None
        self._hotkey_watch: asyncio.Task | None = None
        #: apps launched since the reset, by the host pid of their launch
        self.launched: dict[int, LaunchedApp] = {}
        #: Ctrl+Alt+T opened a terminal, or a dock click an app, since the last action wait
        self.desktop_launched = False
        self._dock_launches: set[asyncio.Task] = set()
        #: ``(monotonic s, quiet s)``: when the last action/eval wait on drawing reports ended
        #: and the quiet it ended with; dropped by any request but a read (:data:`READ_ONLY_ROUTES`)
        self.quiet_mark: tuple[float, float] | None = None
        #: the next observation, grabbed during a wait's quiet window (:mod:`.prepared_obs`)
        self.prepared = PreparedObservations(self.x)
        #: requests other than reads (:data:`READ_ONLY_ROUTES`) and resets under way, and how
        #: many began so far (``server.guarded`` counts them)
        self.changing = 0
        self.changes = 0
        #: :attr:`changes` when the desktop was last in a reset's state (its start, a reset
        #: no such request ran during); ``None``: not since. Equal to :attr:`changes`: only
        #: reads came since, a fast reset has nothing to undo (:meth:`_touched_by`)
        self.clean_at: int | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.x.run(self.session.start)
        self.keyboard_baseline = await self.x.run(lambda: keyboard_state(self.x.ctx().display))
        self.x_baseline = await self.x.run(lambda: snapshot(self.x.ctx().state, keymap=True))
        self._reaper = asyncio.create_task(self._reap_forever())
        self._hotkey_watch = asyncio.create_task(self._watch_hotkey_forever())
        if self.session.dock is not None:
            asyncio.get_running_loop().add_reader(self.session.dock.fd, self._dock_clicked)
        self.clean_at = self.changes  # HOME is the baseline, the bus and the sandbox are new

    async def stop(self) -> None:
        if self.session.dock is not None and self.session.dock.fd is not None:
            asyncio.get_running_loop().remove_reader(self.session.dock.fd)
        for task in (self._reaper, self._hotkey_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._heavy_refresh is not None:
            with contextlib.suppress(Exception):
                await self._heavy_refresh  # a /proc scan in a thread: let it end
        if self.recorder is not None:  # its last attempt's flows into the archive
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.recorder.end)
        await self.x.run(self.x.drop_ctx)
        await self.x.run(self.session.close)
        self.x.shutdown()
        if self.remove_state:
            shutil.rmtree(self.session.state, ignore_errors=True)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.session.procs.reap)

    async def _watch_hotkey_forever(self) -> None:
        while True:
            await asyncio.sleep(HOTKEY_POLL_S)
            with contextlib.suppress(Exception):  # e.g. the display restarting
                await self.check_hotkey()

    async def check_hotkey(self) -> int:
        """Open a terminal for each Ctrl+Alt+T pressed since the last look (:mod:`.hotkeys`),
        as GNOME does on OSWorld's VM, started like ``/setup/launch`` starts apps (the desktop
        user, the task's environment and session bus, the sandbox). Returns how many opened."""
        presses = await self.x.run(lambda: h.take() if (h := self.x.ctx().hotkey) else 0)
        argv = apps.terminal_command() if presses else None
        if argv is None:
            return 0
        for _ in range(presses):
            await self.x.run(self._spawn_app, argv, False)
        self.desktop_launched = True
        return presses

    def _dock_clicked(self) -> None:
        """Names came on the dock's FIFO (:mod:`.dock_channel`): open each favourite."""
        assert self.session.dock is not None
        for name in self.session.dock.take():
            task = asyncio.get_running_loop().create_task(self.launch_favourite(name))
            self._dock_launches.add(task)
            task.add_done_callback(self._dock_launches.discard)

    async def _dock_launched(self) -> bool:
        """Start the dock's launches whose names wait on its FIFO and wait for those under way
        (apps being started); whether a dock click or Ctrl+Alt+T opened an app since the last
        action wait."""
        if self.session.dock is not None:
            self._dock_clicked()
        if self._dock_launches:
            await asyncio.gather(*list(self._dock_launches), return_exceptions=True)
        return self.desktop_launched

    async def sync_dock(self) -> bool:
        """The ``vm`` session's dock shows the desktop user's ``favorite-apps`` as they are
        now (:meth:`.Session.sync_dock`; a ``stat`` when nothing changed, no thread hop).
        Not while a reset runs (it restores the baseline's dock itself). Whether the dock
        was reloaded (the prepared observation, grabbed before, is dropped then)."""
        if self.reset_lock.locked() or not self.session.dock_changed():
            return False
        try:
            detail = await self.x.run(self.session.sync_dock)
        except SessionError as exc:  # the old dock stays
            log.error("%s", exc)
            return False
        if not detail:
            return False
        shown = self.session.favourites.shown if self.session.favourites else ()
        log.info("the dock shows %s now (%.2f s)", ", ".join(shown) or "nothing", detail["dock_s"])
        self.prepared.drop()
        return True

    async def launch_favourite(self, name: str) -> bool:
        """Open the ``vm`` session's favourite ``name`` (a desktop file name, e.g.
        ``vlc.desktop``: one the dock shows now, :mod:`.dock_favourites`), as a click on its dock icon does on
        OSWorld's VM: its desktop file's command (:attr:`.Session.dock_commands`), started as
        ``/setup/launch`` starts apps (the desktop user, the task's environment and session
        bus, inside the sandbox; a task process the next reset kills). The next action wait
        waits for it as for a launch. Returns ``False`` (logged) for a name that is not one of
        the favourites the dock shows, and while a reset runs (it would kill the app anyway)."""
        argv = self.session.dock_commands.get(name)
        if argv is None:
            log.warning("the dock named %r, which is not one of its favourites: ignored", name)
            return False
        if self.reset_lock.locked():
            log.info("dock click on %s during a reset: not opened", name)
            return False
        self.quiet_mark = None  # the screen is about to change: no quiet credit, no prepared obs
        self.prepared.drop()
        self.changes += 1
        await self.x.run(self._spawn_app, argv, False)
        self.desktop_launched = True
        return True

    # -- helpers --------------------------------------------------------------------------------

    @property
    def home(self) -> str:
        """HOME as the desktop's processes see it (``/home/user`` in a sandbox)."""
        return self.session.desktop_home

    async def run_command(
        self, argv, shell: bool, timeout: float, input: bytes | None = None
    ) -> subprocess.CompletedProcess:
        return await asyncio.to_thread(
            self.session.procs.run,
            argv,
            self.session.run_as(),
            shell=shell,
            timeout=timeout,
            input=input,
        )

    def _mark_launch(self) -> None:
        ctx = self.x.ctx()
        self.launch_mark = LaunchMark(ctx.screen.frame(), frozenset(ctx.windows.client_ids()))

    def _spawn_app(self, argv, shell: bool) -> subprocess.Popen:
        program = apps.program_of(argv)
        argv, shell = apps.with_session_bus(argv, shell, desktop_bus=self.session.bus is not None)
        self._mark_launch()
        with open(self.session.state / "apps.log", "ab", opener=_private) as log:
            proc = self.session.procs.spawn(
                argv, self.session.run_as(), shell=shell, stdout=log, stderr=log
            )
        self.launched[proc.pid] = LaunchedApp(program, {proc.pid})
        return proc

    def _launch_app(self, argv, shell: bool) -> tuple[subprocess.Popen, frozenset[int]]:
        """:meth:`_spawn_app` and the managed windows just before it (one X-thread job, so no
        other launch's mark comes in between): ``(proc, windows)``."""
        proc = self._spawn_app(argv, shell)
        assert self.launch_mark is not None
        return proc, self.launch_mark.windows

    def launched_pids(self, table: dict) -> set[int]:
        """Host pids of the live processes of the apps launched since the reset
        (:class:`LaunchedApp`): the launches and their descendants, including those seen
        before and since reparented. Updates the record (a ``/proc`` table in, no X call)."""
        pids: set[int] = set()
        for root, app in list(self.launched.items()):
            for pid in list(app.pids):
                app.pids |= descendants(pid, table)
            app.pids = {p for p in app.pids | {root} if p in table and table[p].state != "Z"}
            pids |= app.pids
        return pids

    def main_window_pids(self) -> set[int] | None:
        """Host pids owning a main window (:func:`~.app_windows.is_main_window`; X thread);
        ``None`` when the X server cannot tell windows' processes (no X-Resource extension)."""
        display = self.x.ctx().display
        if not owners_known(display):
            return None
        owners = window_pids(display, self.x.ctx().windows.client_ids())
        return {pid for wid, pid in owners.items() if is_main_window(display, wid)}

    async def apps_without_window(self) -> list[LaunchedApp]:
        """The apps launched since the reset (programs of :data:`~.apps.WINDOWED_PROGRAMS`)
        not settled yet that still run and own no main window (``[]`` when the X server
        cannot tell). Those with a main window are settled."""
        if not any(
            not app.settled and app.program in apps.WINDOWED_PROGRAMS
            for app in list(self.launched.values())
        ):
            return []
        table = await asyncio.to_thread(own_process_table)
        self.launched_pids(table)
        waiting = [
            app
            for app in list(self.launched.values())
            if not app.settled and app.program in apps.WINDOWED_PROGRAMS and app.pids
        ]
        if not waiting:
            return []
        owners = await self.x.run(self.main_window_pids)
        if owners is None:
            return []
        for app in waiting:
            app.settled = bool(app.pids & owners)
        return [app for app in waiting if not app.settled]

    def _main_windows_by_pid(self) -> dict[int, list]:
        """``{host pid: [WindowInfo of its main windows]}`` (X thread)."""
        ctx = self.x.ctx()
        out: dict[int, list] = {}
        for wid, pid in window_pids(ctx.display, ctx.windows.client_ids()).items():
            if is_main_window(ctx.display, wid) and (info := ctx.windows.info(wid)) is not None:
                out.setdefault(pid, []).append(info)
        return out

    def _loading_judged(self, app: LaunchedApp) -> bool:
        """Whether ``app``'s loading is judged (:meth:`undrawn_apps`): not for the quick
        windowed programs (a terminal, the editor: they paint at once)."""
        return app.program not in apps.QUICK_WINDOWED_PROGRAMS

    async def mark_busy(self) -> None:
        """Note the busy seconds of every launched app not yet drawn (its processes' main
        threads, :func:`~.drawn.busy_s`), so that the first look of :meth:`undrawn_apps`
        judges its loading over the whole wait since (a /proc read per process)."""
        now = time.monotonic()
        for app in list(self.launched.values()):
            if not app.drawn and self._loading_judged(app):
                pids = set(app.pids)
                app.busy = (now, await asyncio.to_thread(drawn.busy_per_pid, pids))

    async def undrawn_apps(self, *, loading: bool = True) -> list[LaunchedApp]:
        """The apps launched since the reset that have a main window but do not show their
        content yet: a main window is blank (:func:`~.drawn.blank`), or (``loading``) the app
        is loading: the main threads of its processes that own main windows were busy over
        :data:`~.drawn.IDLE_SHARE` of the time since its mark (:meth:`mark_busy`, or the last
        look that found it busy), or idle for less than :data:`~.drawn.IDLE_WINDOW_S`. Apps
        found drawn are marked so and not judged again for loading; ``loading=False`` (after an
        action) judges blankness only, of every launched app. An app with no main window is
        not judged (:meth:`apps_without_window` waits for that)."""
        judged = [
            app
            for app in list(self.launched.values())
            if app.settled
            and app.program in apps.WINDOWED_PROGRAMS
            and (not app.drawn or not loading)
        ]
        if not judged:
            return []
        if loading:  # after an action: the pids the reset's waits saw (a /proc scan is ~8 ms)
            self.launched_pids(await asyncio.to_thread(own_process_table))

        def look() -> tuple[dict[int, list], np.ndarray]:
            return self._main_windows_by_pid(), self.x.ctx().screen.frame()

        windows, frame = await self.x.run(look)
        now = time.monotonic()
        undrawn = []
        for app in judged:
            mine = [w for pid in app.pids for w in windows.get(pid, ())]
            if not mine:
                continue
            is_blank = any(drawn.blank(frame, w.x, w.y, w.width, w.height) for w in mine)
            still_loading = False
            if loading and self._loading_judged(app):
                owners = {pid for pid in app.pids if pid in windows}
                busy = await asyncio.to_thread(drawn.busy_per_pid, owners)
                if app.busy is None:
                    app.busy = (now, busy)
                    still_loading = True
                else:
                    since, before = app.busy
                    spent = sum(s - before.get(pid, 0.0) for pid, s in busy.items())
                    if spent >= drawn.IDLE_SHARE * (now - since):
                        app.busy = (now, busy)  # busy: idle time counts from here
                        still_loading = True
                    elif now - since < drawn.IDLE_WINDOW_S:
                        still_loading = True
            if is_blank or still_loading:
                undrawn.append(app)
            elif loading:
                app.drawn = True
        return undrawn

    async def window_after_launch(self, program: str, known: frozenset[int]) -> bool:
        """Wait until a main window that was not managed at the launch (``known``: the
        ``_NET_CLIENT_LIST`` then) is managed, as ``wmctrl -l`` lists it, when ``program`` is
        one of :data:`~.apps.QUICK_WINDOWED_PROGRAMS`; at most :data:`LAUNCH_WINDOW_S` seconds,
        one X query every :data:`LAUNCH_WINDOW_POLL_S`. By window, not by process:
        gnome-terminal's window belongs to ``gnome-terminal-server``, which the session bus
        starts, and nautilus or evince may hand a launch to an instance already running.
        Returns whether such a window came (``False`` at once for other programs)."""
        if program not in apps.QUICK_WINDOWED_PROGRAMS:
            return False

        def new_main_window() -> bool:
            ctx = self.x.ctx()
            return any(
                is_main_window(ctx.display, wid)
                for wid in ctx.windows.client_ids()
                if wid not in known
            )

        deadline = time.monotonic() + LAUNCH_WINDOW_S
        while True:
            if await self.x.run(new_main_window):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(LAUNCH_WINDOW_POLL_S)

    async def died_at_once(self, proc: subprocess.Popen, before: set[int]) -> int | None:
        """The exit status of a just-launched app that ended at once, either failing
        (non-zero: a missing program exits 127 in a few ms) or with 0 leaving no process
        running (``xterm -e false``: xterm exits 0 when its command fails). ``None``: still
        running, or it handed over to a process that runs on (a daemonizing launcher).

        Watched for :data:`LAUNCH_CHECK_S` seconds at most, :data:`LAUNCH_SETTLED_S` (and
        two looks ~10 ms apart) once the app has a child of its own that stays alive
        (``xterm``'s shell): an app whose command ended is about to end too. ``before``: the task's pids before the launch. A launcher that
        only passes its arguments to an instance already running also ends with 0 and
        leaves nothing new: it is reported too (setups carry on after it)."""
        t0 = time.monotonic()
        # processes below ``proc`` that are not the app's children: sandboxed, proc is the
        # enter helper and the app its child
        wrappers = 1 if self.session.sandbox is not None else 0
        seen: set[int] = set()  # live below proc at the last look (a child must stay alive)
        while proc.poll() is None and time.monotonic() < t0 + LAUNCH_CHECK_S:
            await asyncio.sleep(0.005)
            if time.monotonic() >= t0 + LAUNCH_SETTLED_S:
                table = await asyncio.to_thread(own_process_table)
                live = {p for p in descendants(proc.pid, table) if table[p].state != "Z"}
                if len(live & seen) > wrappers:
                    return None
                seen = live
                await asyncio.sleep(0.005)
        if proc.returncode is None:
            return None
        if proc.returncode != 0:
            return proc.returncode
        table = await asyncio.to_thread(self.session.process_table)
        left = {p for p in self.session.task_pids(table) if table[p].state != "Z"}
        return 0 if not left - before - {proc.pid} else None

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists as the desktop user sees it (``test -e`` run as the user,
        inside the sandbox: a symlink resolves there, never against the host's root)."""
        done = await self.run_command(["test", "-e", path], False, EXISTS_TIMEOUT_S)
        return done.returncode == 0

    async def task_pids(self) -> set[int]:
        """The task's processes now (host pids; a ``/proc`` scan, a few ms)."""
        return await asyncio.to_thread(self.session.task_pids)

    def apps_log_tail(self, chars: int = 500) -> str:
        """The end of ``apps.log`` (the launched apps' stdout and stderr)."""
        try:
            with open(self.session.state / "apps.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""

    def heavy_app_running(self) -> bool:
        table = self.session.process_table()
        return any(
            table[pid].comm in HEAVY_APPS for pid in self.session.task_pids(table) if pid in table
        )

    # -- operations used by several routes ------------------------------------------------------

    async def reset(self, full: bool) -> dict:
        """Fast reset (kill the task's processes, restore HOME, restore the keyboard layout the
        desktop started with), or a full restart when asked, when the display died, or when
        the fast reset failed. ``keyboard_restored`` in the answer says what a task had changed
        about the keyboard (:mod:`.keymap`). A fast reset of a desktop that is in the reset's
        state already (:meth:`_touched_by`) only parks the pointer and answers
        ``untouched: true``; any other fast reset says what it had to undo (``touched_by``)."""
        async with self.reset_lock:
            t0 = time.perf_counter()
            kind = "full" if full or not self.session.alive() else "fast"
            detail: dict = {}
            touched = await self._touched_by() if kind == "fast" else None
            if kind == "fast" and touched is None:
                await self.x.run(self._settle_input)  # parked where a reset parks it
                return {"kind": "fast", "reset_s": time.perf_counter() - t0, "untouched": True}
            self.clean_at = None
            quiet = self.changing == 0  # nothing else under way as the reset begins ...
            changes = self.changes  # ... and nothing else begins until it ends
            if kind == "fast":
                try:
                    detail = await self.x.run(self._fast_reset_sync)
                    if detail.get("reverted"):
                        kind = "revert"  # the task wrote outside HOME: the sandbox was reverted
                except Exception as exc:  # fall back to the full restart
                    detail = {"fast_error": str(exc)}
                    kind = "full"
            if kind == "full":
                detail |= await self.x.run(self._full_reset_sync)
            self.launch_mark = self.before_action = None
            self.launched = {}
            self.desktop_launched = False
            if quiet and self.changing == 0 and self.changes == changes:
                self.clean_at = changes
            if touched is not None:
                detail["touched_by"] = touched
            return {"kind": kind, "reset_s": time.perf_counter() - t0, **detail}

    async def _touched_by(self) -> str | None:
        """What a fast reset has to undo, in a few words (``"task processes: xterm"``), or
        ``None`` when the desktop is in a fast reset's state already: only reads reached it
        since it started or since its last reset, during which no other request ran
        (:attr:`clean_at`), no task process runs (a read such as ``/accessibility`` may
        start the AT-SPI services; Ctrl+Alt+T pressed by hand opens a terminal), and its
        sandbox and session bus are alive (a fast reset would revert or restart them). A
        fresh desktop's first reset took 0.17-0.22 s of the first attempts' critical path
        (issue 18)."""
        if self.changing:
            return "a request under way"
        if self.clean_at != self.changes:
            return "requests since the last reset"
        session = self.session
        if session.sandbox is not None and not session.sandbox.alive():
            return "the sandbox exited"
        cap = session.limit_hit()
        if cap is not None:  # the reset must revert the sandbox
            return f"the {cap} cap was hit"
        if session.bus is not None and not session.bus.alive():
            return "the session bus exited"
        table = await asyncio.to_thread(self.session.process_table)
        pids = {p for p in self.session.task_pids(table) if not ended(table[p])}
        if pids:
            names = sorted({table[p].comm for p in pids if p in table})
            return "task processes: " + ", ".join(names or ["(exited)"])
        return None

    def _fast_reset_sync(self) -> dict:
        # a connection a task killed (KillClient, X-Resource lists them): a full restart
        # instead, or every route using it would fail until one
        self.x.ctx().check_alive()
        detail = self.session.fast_reset()
        detail |= self._restore_keyboard()
        detail |= self._restore_x_state()
        self._settle_input()
        return detail

    def _full_reset_sync(self) -> dict:
        self.x.drop_ctx()
        detail = self.session.full_reset()
        # the new X server's root properties and window ids are the baseline from now on
        self.x_baseline = snapshot(self.x.ctx().state, keymap=True)
        detail |= self._restore_keyboard()
        self._settle_input()
        return detail

    def _restore_keyboard(self) -> dict:
        """The layout the desktop started with, back if a task changed it (``setxkbmap de``
        survives killing the task's processes): ``{"keyboard_restored": "layout de -> us"}``
        or ``{}``. Raises ``KeymapError`` when it cannot be restored (a fast reset then falls
        back to a full restart, whose new X server starts with the default layout)."""
        if self.keyboard_baseline is None:
            return {}
        restored = restore_keyboard(
            self.x.ctx().display, self.session.display, self.keyboard_baseline
        )
        return {"keyboard_restored": restored} if restored else {}

    def _restore_x_state(self) -> dict:
        """The X server's state at start (:mod:`.xstate`: locks, button map, screen saver,
        resources, cut buffers, selections, font path, access control...), back if the task
        changed it: ``{"x_restored": ["pointer_mapping", ...]}`` or ``{}``. Raises
        ``XStateError`` when it cannot be (a fast reset then falls back to a full restart)."""
        if self.x_baseline is None:
            return {}
        restored = restore(self.x.ctx().state, self.x_baseline)
        return {"x_restored": restored} if restored else {}

    def _settle_input(self) -> None:
        ctx = self.x.ctx()
        ctx.input.release_all()
        width, height = ctx.screen.size
        # Park the pointer where it hovers over nothing, one pixel off the corner: a pointer
        # in a corner trips pyautogui's fail-safe in OSWorld's setup commands (FailSafeException).
        ctx.input.move(width - 2, height - 2)
        ctx.display.sync()

    async def wait_ready(
        self, mode: str, source: str | None = None, app_window_s: float | None = None, **overrides
    ) -> ReadyResult:
        """Wait until the screen is ready (:func:`~..ready.wait_until_ready`) in ``mode``.
        ``source``: ``damage`` | ``poll`` (``None``: the server's default); ``damage`` polls
        when the X server has no DAMAGE extension. ``overrides``: :class:`~..ready.ReadyPolicy`
        fields. Raises ``ValueError`` for an unknown mode or source.

        An action that pressed Ctrl+Alt+T (:meth:`check_hotkey`) is waited for as a launch
        (the terminal's window, within the launch cap), the answer's ``mode`` stays
        ``action``; so is one that clicked a dock icon (:meth:`launch_favourite`), also when
        the dock's name reaches the server only during the action's screen wait (the launch
        part then follows it: the app's main window and content). After a launch or reset,
        once the screen is ready, the wait goes on while an app launched since the reset runs
        without a main window
        (:meth:`apps_without_window`: GIMP's splash comes seconds before its main window),
        then waits for the screen again; all within the mode's cap (``timeout_s``), or within
        ``app_window_s`` when that is longer (a launched app's main window has its own cap: a
        loaded machine starts GIMP in more than a reset's 10 s; a screen wait that ran out
        while such an app was still coming up goes on waiting for it); an app is waited for
        once (:class:`LaunchedApp` ``settled``). Mode ``apps`` is those two parts
        alone, for a client that waited for the screen its own way (the osworld backend over
        a local desktop server, after a reset and after each action): it answers at once,
        ``ready_s`` 0, when no terminal was opened and no launched app lacks its window.

        An ``eval`` wait that follows an ``action`` or ``eval`` wait on drawing reports, with
        only reads in between (:data:`READ_ONLY_ROUTES`: the observation, the model's turn),
        counts the quiet since that wait as part of its window (``quiet_before_s`` of
        :func:`~..ready.wait_until_ready`): the reports show whether anything drew meanwhile,
        so a screen quiet all along is graded without sleeping a new window.

        Every wait first brings the ``vm`` session's dock up to date with the desktop user's
        ``favorite-apps`` (:meth:`sync_dock`: a setup's ``gsettings set`` shows in the first
        observation), and looks again after the screen wait (the policy's ``gsettings`` in a
        terminal ends after the keypress that started it); the reload waits until the new
        dock is drawn."""
        if mode != "apps" and mode not in MODES:
            raise ValueError(
                f"field 'mode' must be one of {sorted([*MODES, 'apps'])}, got {mode!r}"
            )
        source = source or self.ready_source
        if source not in READY_SOURCES:
            raise ValueError(f"field 'source' must be one of {READY_SOURCES}, got {source!r}")
        await self.sync_dock()  # a setup's or the policy's gsettings: the dock shows it first
        action, apps_only = mode == "action", mode == "apps"
        if action or apps_only:
            await self._dock_launched()
            hotkey = await self.check_hotkey() or self.desktop_launched
            self.desktop_launched = False
            if hotkey:
                mode, apps_only = "launch", False
        if apps_only:
            mode = "launch"
        mark = self.launch_mark if mode in ("launch", "reset") and not apps_only else None
        reference = (
            mark.frame if mark is not None else self.before_action if mode == "action" else None
        )
        if mode in ("launch", "reset") and not apps_only:  # apps: no /proc scan per action
            self.heavy = await asyncio.to_thread(self.heavy_app_running)
        if mode in ("launch", "reset"):
            await self.mark_busy()  # an app's loading is judged over the whole wait
        heavy = self.heavy  # action/eval: as of the end of the previous wait (see below)
        policy = policy_for(mode, heavy=heavy, launch_pending=mark is not None, **overrides)

        async def grab() -> np.ndarray:
            return await self.x.run(lambda: self.x.ctx().screen.frame())

        async def new_window() -> bool:
            ids = await self.x.run(lambda: self.x.ctx().windows.client_ids())
            return bool(set(ids) - mark.windows) if mark is not None else False

        def take() -> Activity:
            reports = self.x.ctx().damage
            return reports.take() if reports is not None else Activity(Delta(0))

        async def activity() -> Activity:
            seen = await self.x.run(take)
            self.prepared.seen(seen)
            return seen

        damage = source == "damage" and await self.x.run(lambda: self.x.ctx().damage is not None)
        credit_s = 0.0
        if mode == "eval" and damage and self.quiet_mark is not None:
            ended_at, quiet_s = self.quiet_mark  # only reads came since: see quiet_mark
            credit_s = quiet_s + (time.monotonic() - ended_at)
        self.quiet_mark = None
        if apps_only:
            result = ReadyResult(0.0, 0, False, False, "damage" if damage else "poll")
        else:
            result = await wait_until_ready(
                grab,
                policy,
                reference=reference,
                new_window=new_window,
                activity=activity if damage else None,
                quiet_before_s=credit_s,
                on_look=self.prepared.on_look if damage and mode != "eval" else None,
            )
        await self.sync_dock()  # gsettings the action started ended during the wait
        if mode == "action" and await self._dock_launched():  # clicked: tint2's name came later
            self.desktop_launched = False
            self.prepared.drop()  # grabbed before the app's window: not the next observation
            mode = "launch"
            policy = policy_for("launch", heavy=heavy, **overrides)
        if damage and mode in ("action", "eval") and not result.timed_out:
            self.quiet_mark = (time.monotonic(), result.quiet_s)
        if result.timed_out:
            self.prepared.drop()
        if mark is not None and result.changed:
            self.launch_mark = None
        cap_s = max(policy.timeout_s, app_window_s or 0.0)
        if mode in ("launch", "reset") and (not result.timed_out or cap_s > policy.timeout_s):
            result = await self._wait_app_windows(
                result, replace(policy, timeout_s=cap_s), grab, activity if damage else None
            )
        elif mode == "action" and not result.timed_out:
            result = await self._wait_blank_windows(result, policy)
        if action:
            self.before_action = None
        self._refresh_heavy()
        return result

    async def _wait_blank_windows(self, first: ReadyResult, policy) -> ReadyResult:
        """After an action's quiet screen ``first``: while a launched app's main window is blank
        (:meth:`undrawn_apps` without the loading part: a window that draws nothing is quiet),
        look again every :data:`CONTENT_POLL_S`, within ``policy.timeout_s`` from the start of
        ``first``; ``undrawn`` (and ``timed_out``) when one is still blank then."""
        if not await self.undrawn_apps(loading=False):
            return first
        t0 = time.monotonic() - first.ready_s
        while await self.undrawn_apps(loading=False):
            if time.monotonic() - t0 >= policy.timeout_s:
                return replace(first, ready_s=time.monotonic() - t0, timed_out=True, undrawn=True)
            await asyncio.sleep(CONTENT_POLL_S)
        return replace(first, ready_s=time.monotonic() - t0, changed=True)

    async def _wait_app_windows(self, first: ReadyResult, policy, grab, activity) -> ReadyResult:
        """After a launch/reset wait ``first``: wait while :meth:`apps_without_window` names
        an app, then for a quiet screen again; the whole within ``policy.timeout_s`` seconds
        from the start of ``first``. The combined result (``first`` itself when no app was
        missing its window, timed out or not)."""
        t0 = time.monotonic() - first.ready_s
        waited = False
        while missing := await self.apps_without_window():
            waited = True
            if time.monotonic() - t0 >= policy.timeout_s:
                for app in missing:
                    app.settled = True  # not waited for again
                return ReadyResult(
                    policy.timeout_s, first.frames, first.changed, True, first.source
                )
            await asyncio.sleep(APP_WINDOW_POLL_S)
        # a mapped window is not a drawn one: its content, and the app done loading (drawn.py)
        t_content = time.monotonic()
        while undrawn := await self.undrawn_apps():
            waited = True
            now = time.monotonic()
            if now - t0 >= policy.timeout_s or now - t_content >= drawn.LOADING_CAP_S:
                for app in undrawn:
                    app.drawn = True  # not waited for again
                return ReadyResult(
                    time.monotonic() - t0, first.frames, True, True, first.source, undrawn=True
                )
            await asyncio.sleep(CONTENT_POLL_S)
        if not waited:
            return first
        left = max(policy.timeout_s - (time.monotonic() - t0), policy.tick_s)
        again = await wait_until_ready(
            grab, replace(policy, require_change=False, timeout_s=left), activity=activity
        )
        return ReadyResult(
            time.monotonic() - t0,
            first.frames + again.frames,
            True,
            again.timed_out,
            first.source,
        )

    def _refresh_heavy(self) -> None:
        """Look again, in the background, whether a heavy app runs (a /proc scan: ~8 ms with
        200 processes, too slow to pay before every action's wait): an app the policy
        started gets the heavy quiet window from the action after the one that started it."""
        if self._heavy_refresh is not None and not self._heavy_refresh.done():
            return

        async def refresh() -> None:
            self.heavy = await asyncio.to_thread(self.heavy_app_running)

        self._heavy_refresh = asyncio.get_running_loop().create_task(refresh())

    async def close_windows(self, ids: list[int], grace_s: float = CLOSE_GRACE_S) -> dict[int, str]:
        """Close the managed windows ``ids``: ask the window manager (``_NET_CLOSE_WINDOW``,
        the app gets ``WM_DELETE_WINDOW``), and kill the X client of those still open after
        ``grace_s`` seconds. Returns ``{id: "closed" | "killed" | "open" | "gone"}`` (``gone``:
        it had closed already; ``open``: it survived both)."""

        def present() -> set[int]:
            return set(self.x.ctx().windows.client_ids())

        async def wait_gone(wanted: list[int]) -> set[int]:
            deadline = time.monotonic() + grace_s
            while True:
                left = set(wanted) & await self.x.run(present)
                if not left or time.monotonic() > deadline:
                    return left
                await asyncio.sleep(0.02)

        now = await self.x.run(present)
        outcome = {wid: "gone" for wid in ids if wid not in now}
        asked = [wid for wid in ids if wid in now]
        for wid in asked:
            await self.x.run(self.x.ctx().windows.close, wid)
        stubborn = await wait_gone(asked)
        outcome |= {wid: "closed" for wid in asked if wid not in stubborn}
        for wid in stubborn:
            with contextlib.suppress(Exception):  # BadValue: it closed meanwhile
                await self.x.run(self.x.ctx().windows.kill, wid)
        survivors = await wait_gone(list(stubborn))
        outcome |= {wid: "open" if wid in survivors else "killed" for wid in stubborn}
        return outcome

    def perform(self, action: Action) -> None:
        """Grab the screen (the action wait's reference) and clear the drawing reports (the
        wait's first look then reports the action's drawing only), then perform ``action``
        (X thread)."""
        ctx = self.x.ctx()
        self.before_action = ctx.screen.frame()
        if ctx.damage is not None:
            ctx.damage.take()
        ctx.input.perform(action)


def desktop_of(request: Request) -> DesktopServer:
    """The :class:`DesktopServer` a request is served by (set on the app by ``build_app``)."""
    return request.app.state.desktop


def _private(path: str, flags: int) -> int:
    """``open`` opener creating the file 0600 (the task's output is no host user's)."""
    return os.open(path, flags, 0o600)
