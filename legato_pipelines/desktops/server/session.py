"""One desktop session: Xvfb + openbox + the desktop user's HOME + the task's processes.

Layout of the state directory (one per desktop server)::

    baseline/   the clean HOME, built once at start (blink off, XDG folders)
    home/       the live HOME of the desktop user (restored from baseline on reset)
    run/        XDG_RUNTIME_DIR (0700, the desktop user's; emptied on reset)
    tmp/        TMPDIR of the task's processes (emptied on reset)
    wm/         HOME of the window manager (its config and cache stay out of the task's HOME)
    apps.log    stdout/stderr of the task's processes (0600); xvfb.log, wm.log of the
                infrastructure

Sandboxed (the default; :mod:`.sandbox`): task processes run inside the desktop's own
namespaces as OSWorld's ``user`` with HOME ``/home/user``; HOME then lives in
``sandbox/homes/user``, and each sandbox's own ``sandbox/layers-N/tmp/`` and ``run/`` (new for
every sandbox) are seen inside as ``/tmp`` and ``/run/user/1000``: all under ``sandbox/`` (0700, root's), so that no host user, not
even the host's uid 1000 (the sandbox's ``user``), reaches what the task wrote. Unsandboxed (``sandbox=False``), when the server runs as root, task
processes run as an unprivileged host user (``legato-desktop`` by default, created with
``useradd`` if missing) with the state directory's paths as they are. Xvfb and openbox run as
the server itself under ``setpriv --pdeathsig KILL``, so they die with it even when it is
SIGKILLed; X apps then exit because their display is gone.

Timings this is built on (docs/local-desktop.md §3, §7): Xvfb ready ~50 ms,
openbox ready ~50 ms, kill + verify ~40 ms, ``rm -rf`` + ``cp -a`` ~13 ms.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import accessibility, app_profiles, chrome, dbus_session, vm_look
from . import home as home_mod
from .dock_channel import DockChannel
from .dock_favourites import DockFavourites, wait_for_dock
from .leftovers import empty_dir
from .procs import ProcessTable, ProcInfo, RunAs, descendants, own_process_table
from .sandbox import SANDBOX_HOME, SANDBOX_UID, SANDBOX_USER, Sandbox, SandboxError

log = logging.getLogger(__name__)

DESKTOP_USER = "legato-desktop"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: X resources set on the root window: a scalable xterm font (no "cannot load font" warning,
#: docs/local-desktop.md §9) and no blinking cursors.
X_RESOURCES = "XTerm*faceName: DejaVu Sans Mono\nXTerm*faceSize: 11\n*cursorBlink: false\n"
XVFB_TIMEOUT_S = 10.0
#: How long Xvfb gets to exit on SIGTERM (removing its lock and socket) before SIGKILL.
XVFB_STOP_S = 2.0
#: First X display number a desktop tries (lower ones are left to the machine's own X servers).
DISPLAY_BASE = 20
PREBUILD_APPS = ("libreoffice",)
WM_TIMEOUT_S = 10.0


class SessionError(RuntimeError):
    """The session could not be started, reset or verified; the message says which step."""


def ensure_user(name: str) -> tuple[int, int]:
    """(uid, gid) of ``name``, creating it (system user, own group, shell bash) if missing.

    Safe when several servers start at once (a concurrent ``useradd`` counts as success).
    Raises :class:`SessionError` when the user cannot be created.
    """
    try:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        pass
    done = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/bin/bash",
            name,
        ],
        capture_output=True,
        text=True,
    )
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise SessionError(
            f"cannot create the desktop user {name!r} with useradd: {done.stderr.strip()}"
        ) from None
    return entry.pw_uid, entry.pw_gid


def openbox_config(session: str = "plain") -> str:
    """The system openbox ``rc.xml`` with one desktop and no root-window menus; with
    ``session="vm"``, the rules maximizing the apps the VM maximizes (:mod:`.vm_look`).

    One desktop: the default four let a scroll on the empty desktop hide every window.
    No root menu: its entries would let a click exit the window manager.
    """
    path = Path("/etc/xdg/openbox/rc.xml")
    if not path.is_file():
        raise SessionError(
            "openbox is not installed (/etc/xdg/openbox/rc.xml missing): apt-get install openbox"
        )
    text = path.read_text()
    text = re.sub(
        r"(<desktops>.*?<number>)\d+(</number>)", r"\g<1>1\g<2>", text, count=1, flags=re.S
    )
    text = re.sub(
        r'<context name="Root">.*?</context>',
        '<context name="Root"></context>',
        text,
        count=1,
        flags=re.S,
    )
    if session == "vm":
        rules = vm_look.openbox_applications()
        text = text.replace("</applications>", f"{rules}</applications>", 1)
    return text


class Session:
    """Xvfb, window manager, HOME and processes of one desktop. Not thread-safe: call it from
    one long-lived thread (Xvfb's parent-death signal fires when the spawning *thread* exits).

    Args:
      width, height  screen size in pixels
      state_dir      the directory laid out as in the module docstring (created if missing)
      user           desktop user when running as root (``None``: run everything as ourselves)
      template       a directory copied into the baseline HOME (e.g. pre-built app profiles)
      prebuild       apps whose pre-built profile goes into the baseline (``libreoffice``: built
                     once and cached, :mod:`.app_profiles`; a GUI start then skips creating
                     it); ``None`` (the default): LibreOffice's when it is installed, and
                     without one (a warning) when it cannot be built or cached
      sandbox        run the task's processes in the desktop's own namespaces (:mod:`.sandbox`);
                     ``False`` runs them on the host as ``user`` (no isolation)
      network        sandboxed only: ``True`` the host's network, ``False`` none (own loopback)
      forward        sandboxed with ``network=False``: ``{port inside: host port}`` forwarded by
                     ``pasta``, which also gives the namespace a route out (:class:`.Sandbox`)
      limits         sandboxed only: the desktop's resource caps (:class:`.limits.Caps`: a
                     cgroup and a size-capped disk, :mod:`.limits`); ``None``: uncapped
      browser_flags  sandboxed only: flags ``google-chrome`` adds (:mod:`.chrome`), e.g.
                     ``--proxy-server`` (``desktops/web.py``)
      trusted_cas    PEM files of CAs the baseline HOME's NSS database trusts for websites
                     (Chromium's; the web recorder's CA: :mod:`.recorder`)
      session        ``plain`` (openbox on black) or ``vm`` (the VM's look: top bar, dock,
                     Yaru, "Ubuntu" font, Ubuntu's colour, maximized apps; :mod:`.vm_look`)
    """

    def __init__(
        self,
        *,
        width: int,
        height: int,
        state_dir: Path,
        user: str | None = DESKTOP_USER,
        template: Path | None = None,
        prebuild: tuple[str, ...] | None = None,
        sandbox: bool = True,
        network: bool = True,
        forward: dict[int, int] | None = None,
        limits=None,
        browser_flags: Sequence[str] = (),
        trusted_cas: Sequence[Path] = (),
        session: str = "plain",
    ):
        try:
            self.session = vm_look.check_session(session)
        except ValueError as exc:
            raise SessionError(str(exc)) from None
        #: the profiles were asked for (a build that fails is then an error, not a warning)
        self.prebuild_asked = prebuild is not None
        if prebuild is None:
            installed = app_profiles.libreoffice_installed(SYSTEM_PATH)
            prebuild = ("libreoffice",) if installed else ()
        unknown = set(prebuild) - set(PREBUILD_APPS)
        if unknown:
            raise SessionError(
                f"cannot pre-build profiles of {sorted(unknown)}; known: {sorted(PREBUILD_APPS)}"
            )
        self.prebuild = tuple(prebuild)
        self.trusted_cas = tuple(trusted_cas)
        self.width, self.height = width, height
        self.state = Path(state_dir)
        self.template = template
        self.procs = ProcessTable()
        # unsandboxed; sandboxed, every sandbox has its own (Sandbox.tmp_dir, .run_dir)
        self._run_dir = self.state / "run"
        self._tmp = self.state / "tmp"
        self.sandbox: Sandbox | None = None
        if not sandbox and not network:
            raise SessionError("network=none needs the sandbox (sandbox=true)")
        if sandbox:
            try:
                capped = None
                if limits is not None:
                    from .limits import DesktopLimits

                    name = f"{self.state.name}-{os.getpid()}"
                    capped = DesktopLimits(limits, name, self.state / "sandbox")
                self.sandbox = Sandbox(
                    self.state,
                    network=network,
                    forward=forward,
                    limits=capped,
                    browser_flags=browser_flags,
                )
            except SandboxError as exc:
                raise SessionError(str(exc)) from None
            self.user, self.uid, self.gid = SANDBOX_USER, SANDBOX_UID, SANDBOX_UID
            self.home = self.sandbox.home
        elif os.geteuid() == 0 and user:
            self.user = user
            self.uid, self.gid = ensure_user(user)
            self.home = self.state / "home"
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
            self.uid = self.gid = None
            self.home = self.state / "home"
        self.baseline = self.state / "baseline"
        self.wm_home = self.state / "wm"
        self.display: str | None = None
        self._xvfb: subprocess.Popen | None = None
        #: sandboxed: open descriptors of Xvfb's own ipc namespace, which the sandboxes join,
        #: and of that namespace's POSIX message queue directory (an ``mqueue`` mount)
        self.ipc_ns: int | None = None
        self.mqueue: int | None = None
        self._wm: subprocess.Popen | None = None
        #: the ``vm`` session's panels (top bar, dock): infrastructure, as openbox
        self._panels: list[subprocess.Popen] = []
        #: the server's own services beside the desktop (the web recorder: ``root_pid`` gives
        #: the pid of its process, or ``None`` while none runs): infrastructure with
        #: everything below them, so a reset does not kill them
        self.services: list[Callable[[], int | None]] = []
        #: the ``vm`` session's dock: the FIFO its clicks name favourites on
        #: (:mod:`.dock_channel`) and the favourites it shows (:mod:`.dock_favourites`)
        self.dock: DockChannel | None = None
        self.favourites: DockFavourites | None = None
        self._dock_lock = threading.Lock()  # a wait's reload against a reset's
        #: the display's abstract socket name, bound and held (never listening): :func:`_hold_abstract`
        self._x_name: socket.socket | None = None
        self.generation = 0  # bumped on every X (re)start; X clients reconnect when it changes
        # the session D-Bus with dconf (dbus_session.py), when Debian's packages are there
        self.bus_missing = dbus_session.missing()
        self.bus = (
            None
            if self.bus_missing
            else dbus_session.SessionBus(self.procs, self.state / "bus.log")
        )

    # -- paths ---------------------------------------------------------------------------------

    @property
    def tmp(self) -> Path:
        """TMPDIR on the host (sandboxed: the running sandbox's ``/tmp``, a new directory for
        every sandbox, under ``sandbox/`` (0700), out of every host user's reach)."""
        if self.sandbox is not None:
            return self.sandbox.tmp_dir or self.sandbox.dir / "layers-0" / "tmp"
        return self._tmp

    @property
    def run_dir(self) -> Path:
        """XDG_RUNTIME_DIR on the host (sandboxed: the running sandbox's ``/run/user/1000``)."""
        if self.sandbox is not None:
            return self.sandbox.run_dir or self.sandbox.dir / "layers-0" / "run"
        return self._run_dir

    # -- paths as the task sees them ---------------------------------------------------------

    @property
    def desktop_home(self) -> str:
        """HOME as the task's processes see it (``/home/user`` in a sandbox)."""
        return SANDBOX_HOME if self.sandbox is not None else str(self.home)

    # -- environment -------------------------------------------------------------------------

    def task_env(self) -> dict[str, str]:
        """The environment of every task process (built from scratch, nothing inherited).

        With the desktop's session bus (:mod:`.dbus_session`), ``DBUS_SESSION_BUS_ADDRESS``
        names it, GSettings persists in dconf and apps have their accessibility on when AT-SPI
        is installed (:func:`.accessibility.task_env`; else ``NO_AT_BRIDGE``/``GTK_A11Y`` keep
        GTK apps from autolaunching at-spi); without one, ``GSETTINGS_BACKEND=memory`` keeps apps from
        autolaunching dconf and dbus helpers that outlive them (docs/local-desktop.md §9, §10).
        """
        home = self.desktop_home
        sandboxed = self.sandbox is not None
        runtime = f"/run/user/{SANDBOX_UID}" if sandboxed else str(self.run_dir)
        if self.bus is not None:
            bus = {"DBUS_SESSION_BUS_ADDRESS": dbus_session.bus_address(runtime)}
        else:
            bus = {"GSETTINGS_BACKEND": "memory"}
        return {
            "HOME": home,
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/bash",
            "PATH": SYSTEM_PATH,
            "LANG": "C.UTF-8",
            "DISPLAY": self.display or "",
            "XDG_SESSION_TYPE": "x11",
            "XDG_RUNTIME_DIR": runtime,
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state",
            "TMPDIR": "/tmp" if sandboxed else str(self.tmp),
            **accessibility.task_env(self.bus is not None),
            "GTK_USE_PORTAL": "0",
            **bus,
        }

    def run_as(self) -> RunAs:
        """How task, setup and evaluator processes run: the desktop user, in its HOME (inside
        the sandbox when there is one). Raises :class:`SessionError` when the sandbox is down."""
        if self.sandbox is not None:
            try:
                prefix = tuple(self.sandbox.enter_argv())
            except SandboxError as exc:
                raise SessionError(str(exc)) from None
            return RunAs(env=self.task_env(), cwd="/", prefix=prefix)
        return RunAs(env=self.task_env(), cwd=str(self.home), uid=self.uid, gid=self.gid)

    def _infra_run_as(self) -> RunAs:
        env = {"HOME": str(self.wm_home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
        if self.display:
            env["DISPLAY"] = self.display
        return RunAs(env=env, cwd=str(self.wm_home))

    def osworld_ports(self) -> dict[str, int]:
        """Host ports (on 127.0.0.1) where OSWorld's host-side getters reach the desktop's
        Chrome DevTools bridge and VLC's HTTP interface, named as DesktopEnv's ``chromium_port``
        and ``vlc_port`` (``{"chromium": ..., "vlc": ...}``): OSWorld's own 9222 and 8080 on
        the host's network, the forwarded host ports on a network of its own, ``{}`` without a
        way in (``network=False`` without ``forward``)."""
        inside = {"chromium": chrome.CDP_BRIDGE_PORT, "vlc": home_mod.VLC_HTTP_PORT}
        if self.sandbox is None or self.sandbox.network:
            return inside
        forward = self.sandbox.forward
        return {name: forward[port] for name, port in inside.items() if port in forward}

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Prepare the state directory, build the baseline HOME, start Xvfb and openbox."""
        self.state.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o711)  # the desktop user must traverse it to reach its HOME
        if self.sandbox is not None:
            try:
                self.sandbox.prepare()
            except SandboxError as exc:
                raise SessionError(str(exc)) from None
        if self.sandbox is None:  # a sandbox makes its own
            for path in (self.run_dir, self.tmp):
                self._fresh_private_dir(path)
        self.wm_home.mkdir(exist_ok=True)
        (self.wm_home / ".config" / "openbox").mkdir(parents=True, exist_ok=True)
        (self.wm_home / ".config" / "openbox" / "rc.xml").write_text(openbox_config(self.session))
        if self.session == "vm":
            vm_look.write_home(self.wm_home, None, None)  # the panels' font
            self._start_dock()
        profile = self._libreoffice_profile() if "libreoffice" in self.prebuild else None
        templates = [t for t in (profile, self.template) if t is not None]  # the user's last
        home_mod.build_baseline(self.baseline, uid=self.uid, gid=self.gid, templates=templates)
        if self.trusted_cas:
            from .recorder import RecorderError, trust_cas

            try:
                trust_cas(self.baseline, self.trusted_cas, self.uid, self.gid)
            except RecorderError as exc:
                raise SessionError(str(exc)) from None
        if self.session == "vm":
            vm_look.write_home(self.baseline, self.uid, self.gid)
        self._baseline_settings()
        home_mod.restore(self.baseline, self.home)
        if self.favourites is not None:  # the baseline's favourites: the dock's
            self.favourites.mark_seen()
        self.start_x()
        self._start_sandbox()
        self._start_bus()

    def _start_dock(self) -> None:
        """The ``vm`` session's dock: the baseline's favourites as the desktop user's system
        has them (sandboxed, the seed layer's desktop files over the host's: ``google-chrome``
        is the wrapper there), the FIFO their icons write to, the panels' configurations."""
        folders = [vm_look.APPLICATIONS]
        if self.sandbox is not None:
            folders.insert(0, self.sandbox.dir / "seed" / "usr" / "share" / "applications")
        try:
            self.dock = DockChannel(self.state / "dock")
        except OSError as exc:
            raise SessionError(
                f"cannot make the dock's FIFO {self.state / 'dock'}: {exc}"
            ) from None
        self.favourites = DockFavourites(
            folders,
            self.wm_home / "panels",
            self.dock.exec_line,
            self.home / ".config" / "dconf" / "user",
        )
        self._panel_configs = self.favourites.write(vm_look.FAVOURITES)

    @property
    def dock_commands(self) -> dict[str, list[str]]:
        """The argv of each favourite the dock shows (``{}``: no dock), by desktop file id."""
        return self.favourites.commands if self.favourites is not None else {}

    def dock_changed(self) -> bool:
        """Whether the desktop user's dconf database changed since the dock last followed it
        (one ``stat``; ``False`` without a dock or a session bus)."""
        return self.favourites is not None and self.bus is not None and self.favourites.changed()

    def sync_dock(self) -> dict[str, float]:
        """When the dconf database changed (:meth:`dock_changed`): read ``favorite-apps``
        (``gsettings get`` as the desktop user, inside the sandbox) and, when the dock would
        show other favourites, show them (:meth:`_replace_dock`). Returns ``{"dock_s":
        seconds}`` when the dock was replaced, else ``{}``. A key that cannot be read leaves
        the dock as it is (logged). Call it from the X thread (the new tint2 is tied to the
        thread that starts it, as the panels are). Raises :class:`SessionError` when the new
        dock did not show (the old one is kept)."""
        if not self.dock_changed():
            return {}
        assert self.favourites is not None
        with self._dock_lock:
            self.favourites.mark_seen()  # a write from now on is seen by the next look
            schema, key = vm_look.FAVOURITES_KEY
            try:
                done = self.procs.run(
                    ["gsettings", "get", schema, key],
                    self.run_as(),
                    timeout=dbus_session.GSETTINGS_TIMEOUT_S,
                )
            except (subprocess.TimeoutExpired, SessionError) as exc:
                log.warning("the dock's favourites could not be read: %s", exc)
                return {}
            names = vm_look.parse_favourites(done.stdout.decode(errors="replace"))
            if done.returncode != 0 or names is None:
                log.warning(
                    "gsettings get %s %s failed (%s): the dock stays as it is",
                    schema,
                    key,
                    done.stderr.decode(errors="replace").strip()[:200],
                )
                return {}
            return self._show_favourites(names, reload=True)

    def _restore_dock(self, *, reload: bool) -> None:
        """HOME is the baseline's again: the dock shows the baseline's favourites
        (:data:`.vm_look.FAVOURITES`, no need to read them); ``reload``: its tint2 runs and
        reloads (else the next start of the panels reads the new configuration)."""
        if self.favourites is None:
            return
        with self._dock_lock:
            self.favourites.mark_seen()
            self._show_favourites(vm_look.FAVOURITES, reload=reload)

    def _show_favourites(self, names: Sequence[str], *, reload: bool) -> dict[str, float]:
        assert self.favourites is not None
        if self.favourites.shows(names):
            return {}
        before = self.favourites.shown
        self.favourites.write(names)
        if not reload or len(self._panels) < 2 or self.display is None:
            return {}
        try:
            return {"dock_s": self._replace_dock()}
        except SessionError:
            self.favourites.write(before)  # what the old dock, kept, shows
            raise

    def _replace_dock(self) -> float:
        """Start a ``tint2`` on the dock's new configuration over the running one, wait until
        it shows (:func:`.dock_favourites.wait_for_dock`), then end the old one; returns the
        seconds it took. Raises :class:`SessionError` (the new one ended, the old one kept)
        when it does not show."""
        old = self._panels[1]
        new = self._spawn_panel(self._panel_configs[1])
        assert self.display is not None
        try:
            took = wait_for_dock(self.display, new, len(self.dock_commands))
        except RuntimeError as exc:
            new.kill()
            new.wait()
            raise SessionError(f"the dock's favourites: {exc} (see panels.log)") from None
        self._panels[1] = new
        old.kill()
        old.wait()
        return took

    def _start_sandbox(self) -> None:
        if self.sandbox is None:
            return
        try:
            self.sandbox.start(self.x_socket, self.ipc_ns, self.mqueue)
        except SandboxError as exc:
            raise SessionError(str(exc)) from None

    @property
    def x_socket(self) -> str | None:
        """The X server's socket file (``None`` before X started)."""
        return f"/tmp/.X11-unix/X{self.display[1:]}" if self.display else None

    def start_x(self) -> None:
        """Start Xvfb on the first free display number from :data:`DISPLAY_BASE` and openbox.

        A display is claimed through Xvfb's own lock file (``/tmp/.X<n>-lock``, created
        atomically; a second server on the same number exits at once, and the next number is
        tried). A lock whose owner is dead (a server SIGKILLed with its desktop) does not
        count: Xvfb itself replaces it. ``-displayfd`` is not used: with it Xvfb takes no
        lock, and without its abstract socket (always off) two servers would pick the same
        number. Before Xvfb starts on ``:N`` this server binds the abstract name
        ``@/tmp/.X11-unix/XN`` and holds it (:func:`_hold_abstract`); a number whose name is
        taken is skipped. Raises :class:`SessionError` when either is not ready within 10 s.
        """
        deadline = time.monotonic() + XVFB_TIMEOUT_S
        number = DISPLAY_BASE
        with open(self.state / "xvfb.log", "ab") as log:
            while True:
                number = _free_display(number)
                self._x_name = _hold_abstract(number)
                if self._x_name is None:  # another desktop's, or anyone's: not ours to use
                    number += 1
                    continue
                self._xvfb = self.procs.spawn(
                    [
                        "setpriv",
                        "--pdeathsig",
                        "KILL",
                        "--",
                        *self._ipc_prefix(),
                        "Xvfb",
                        f":{number}",
                        "-screen",
                        "0",
                        f"{self.width}x{self.height}x24",
                        "-nolisten",
                        "tcp",
                        # no abstract socket (one namespace for every process on the host
                        # network, sandboxed or not): a sandbox reaches only the socket file
                        # bound into it; host clients connect through the file too (the
                        # abstract name is held by this server, _hold_abstract)
                        "-nolisten",
                        "local",
                        "-noreset",
                    ],
                    self._infra_run_as(),
                    stderr=log,
                    stdout=log,
                )
                if _wait_for_x(number, self._xvfb, deadline):
                    break
                self._x_name.close()
                self._x_name = None
                number += 1
        self.display = f":{number}"
        if self.sandbox is not None:
            pid = self._xvfb.pid
            self.ipc_ns = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
            mqueue = f"/proc/{pid}/root{self.state.resolve() / 'mqueue'}"
            self.mqueue = os.open(mqueue, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with open(self.state / "wm.log", "ab") as wm_log:
            self._wm = self.procs.spawn(
                [
                    "setpriv",
                    "--pdeathsig",
                    "KILL",
                    "--",
                    "openbox",
                    "--config-file",
                    str(self.wm_home / ".config" / "openbox" / "rc.xml"),
                ],
                self._infra_run_as(),
                stdout=wm_log,
                stderr=wm_log,
            )
        _wait_for_wm(self.display, self._wm, WM_TIMEOUT_S, self.session == "vm")
        if self.session == "vm":
            self._start_panels()
        self.generation += 1

    def _start_panels(self) -> None:
        """The ``vm`` session's top bar and dock (``tint2``, :mod:`.vm_look`), as openbox:
        the server's own, killed with it. Returns once their struts shape the work area."""
        for config in self._panel_configs:
            self._panels.append(self._spawn_panel(config))
        _wait_for_panels(self.display, self._panels, WM_TIMEOUT_S)

    def _spawn_panel(self, config: Path) -> subprocess.Popen:
        """Start ``tint2`` on ``config``, logging to ``panels.log``; killed when the calling
        thread ends (``--pdeathsig``: the X thread's, as openbox)."""
        with open(self.state / "panels.log", "ab") as panel_log:
            return self.procs.spawn(
                ["setpriv", "--pdeathsig", "KILL", "--", "tint2", "-c", str(config)],
                self._infra_run_as(),
                stdout=panel_log,
                stderr=panel_log,
            )

    def stop_x(self) -> None:
        """Kill openbox, stop Xvfb (by PID) and reap them; the display's lock file and
        socket are gone afterwards (Xvfb removes them on SIGTERM; when it had to be
        SIGKILLed after :data:`XVFB_STOP_S`, they are removed here if still its own)."""
        for proc in (*self._panels, self._wm):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self._panels = []
        xvfb, number = self._xvfb, self.display
        if xvfb is not None and xvfb.poll() is None:
            xvfb.terminate()
            try:
                xvfb.wait(XVFB_STOP_S)
            except subprocess.TimeoutExpired:
                xvfb.kill()
                xvfb.wait()
        if xvfb is not None and number is not None:
            _remove_display_files(int(number[1:]), xvfb.pid)
        if self._x_name is not None:
            self._x_name.close()
            self._x_name = None
        self._wm = self._xvfb = None
        for fd in (self.ipc_ns, self.mqueue):
            if fd is not None:
                os.close(fd)
        self.ipc_ns = self.mqueue = None
        self.procs.reap()

    def _ipc_prefix(self) -> list[str]:
        """Sandboxed: the argv prefix giving Xvfb an ipc namespace of its own, with
        ``kernel.shm_rmid_forced`` on (as in the sandbox). Xvfb runs as host root: in the
        host's namespace MIT-SHM would let a client (root inside a sandbox is uid 0 to it)
        make it attach, read and overwrite any host System V segment by id. The desktop's
        sandboxes join this namespace (:meth:`.Sandbox.start`), so their apps' segments are
        the ones Xvfb sees and MIT-SHM works for them. Only an owner of the namespace (host
        root) may mount its ``mqueue`` file system, so Xvfb's own mount namespace (a private
        copy of the host's) has it on ``<state>/mqueue``, where the server empties it through
        ``/proc/<Xvfb>/root``. Unsandboxed: none (the host's namespace)."""
        if self.sandbox is None:
            return []
        mqueue = self.state.resolve() / "mqueue"
        mqueue.mkdir(mode=0o700, exist_ok=True)
        script = (
            "echo 1 > /proc/sys/kernel/shm_rmid_forced"
            ' && mount -t mqueue legato-mqueue "$1" && shift && exec "$@"'
        )
        unshare = ["unshare", "--ipc", "--mount", "--propagation", "private", "--"]
        return [*unshare, "sh", "-c", script, "sh", str(mqueue)]

    def alive(self) -> bool:
        """True while Xvfb, the window manager and the ``vm`` session's panels all run (a
        task can end a panel: ``xdotool windowkill`` closes its X connection; the next reset
        is then a full one, which starts them again)."""
        return all(
            p is not None and p.poll() is None for p in (self._xvfb, self._wm, *self._panels)
        )

    def _baseline_settings(self) -> None:
        """dconf settings of the baseline HOME (screen lock and idle off; :mod:`.dbus_session`)."""
        if self.bus is None:
            return
        env = self._baseline_env()
        run_as = RunAs(env=env, cwd=env["HOME"], uid=self.uid, gid=self.gid)
        settings = dbus_session.BASELINE_SETTINGS
        if self.session == "vm":
            settings += vm_look.DCONF_SETTINGS
        try:
            dbus_session.write_baseline_settings(
                self.procs, run_as, self.state / "baseline-bus", settings
            )
        except dbus_session.SessionBusError as exc:
            raise SessionError(str(exc)) from None

    def _start_bus(self) -> dict[str, float]:
        """A fresh session bus for the next attempt; ``{bus_s}`` (seconds), ``{}`` without one."""
        if self.bus is None:
            return {}
        env = self.task_env()
        runtime = env["XDG_RUNTIME_DIR"]
        try:
            return {"bus_s": self.bus.start(self.run_as(), runtime, self.run_dir)}
        except dbus_session.SessionBusError as exc:
            raise SessionError(str(exc)) from None

    def _stop_bus(self) -> None:
        if self.bus is not None:
            try:
                self.bus.stop()
            except dbus_session.SessionBusError as exc:
                raise SessionError(str(exc)) from None

    def close(self) -> None:
        """Kill every process of the desktop (tasks and infrastructure)."""
        me = os.getpid()
        self.stop_x()
        if self.dock is not None:
            self.dock.close()
        try:
            if self.sandbox is not None:
                self.sandbox.close()
            self.procs.kill(lambda table: descendants(me, table))
        finally:  # the disk image and the cgroup go whatever survived (they cannot be reused)
            if self.sandbox is not None and self.sandbox.limits is not None:
                self.sandbox.limits.close()

    def limit_hit(self) -> str | None:
        """The resource cap the desktop hit since its last reset (``pids``, ``memory``,
        ``disk``; :meth:`.limits.DesktopLimits.check`), else ``None`` (also when uncapped)."""
        if self.sandbox is None or self.sandbox.limits is None:
            return None
        return self.sandbox.limits.check()

    def _after_limit_hit(self, cap: str | None) -> None:
        """A reset done: when ``cap`` was hit, wait until the dropped sandbox's layers are
        emptied (the disk's space is back); count hits from now on."""
        if self.sandbox is not None and self.sandbox.limits is not None:
            if cap is not None:
                self.sandbox.settle()
            self.sandbox.limits.rebase()

    # -- the task's processes ---------------------------------------------------------------

    def process_table(self) -> dict[int, ProcInfo]:
        """The host's processes as :meth:`task_pids` and :meth:`infra_pids` judge them: read
        while no sandbox is being forked (:meth:`.Sandbox.process_table`)."""
        return self.sandbox.process_table() if self.sandbox is not None else own_process_table()

    def infra_pids(self, table) -> set[int]:
        """Xvfb, the window manager, the panels, :attr:`services` and anything below them; the
        sandbox's own processes.
        ``table``: from :meth:`process_table`."""
        pids: set[int] = set(self.sandbox.anchor_pids(table)) if self.sandbox is not None else set()
        if self.bus is not None:
            pids |= self.bus.pids(table)
        roots = [p.pid for p in (self._xvfb, self._wm, *self._panels) if p is not None]
        for pid in [*roots, *(root_pid() for root_pid in self.services)]:
            if pid is not None and pid in table:
                pids.add(pid)
                pids |= descendants(pid, table)
        return pids

    def task_pids(self, table=None) -> set[int]:
        """Every process of the task: the server's descendants minus the infrastructure.
        ``table``: from :meth:`process_table` (read now when not given)."""
        table = table if table is not None else self.process_table()
        return descendants(os.getpid(), table) - self.infra_pids(table)

    def kill_task_processes(self) -> int:
        """Kill the task's processes, verify none survived, reap. Returns how many were killed.

        Raises :class:`SessionError` naming any survivor.
        """
        try:
            return len(self.procs.kill(self.task_pids, read_table=self.process_table))
        except RuntimeError as exc:
            raise SessionError(str(exc)) from None

    # -- reset ---------------------------------------------------------------------------------

    def fast_reset(self) -> dict:
        """Kill the task's processes and restore HOME, TMPDIR and XDG_RUNTIME_DIR. Returns
        step timings (s).

        Sandboxed, ``/dev/shm`` and ``/dev/mqueue`` are emptied too; when the task left
        anything else outside HOME (:meth:`.Sandbox.dirty`: a non-empty overlay upper layer,
        a file under ``/root``, a System V semaphore...) or the sandbox died, the sandbox is
        reverted instead: ``reverted`` lists what was left (``etc/x``, ...) and ``revert_s``
        what it cost. A desktop that hit a resource cap (:meth:`limit_hit`) is reverted first
        of all (``reverted``: ``(resource cap hit: pids)``): dropping the pid namespace ends a
        fork bomb at once, where killing its processes one by one races its forks.
        """
        t0 = time.perf_counter()
        detail: dict = {}
        cap = self.limit_hit()
        if cap is not None:  # first drop the sandbox: a fork bomb outruns killing one by one
            detail = {"reverted": [f"(resource cap hit: {cap})"], **self._revert_sandbox()}
        killed = self.kill_task_processes()  # with what the bus activated (dconf-service, ...)
        self._stop_bus()
        t1 = time.perf_counter()
        if self.sandbox is not None and cap is None:
            dirty = self.sandbox.dirty()
            if dirty or not self.sandbox.alive():
                detail = {"reverted": dirty or ["(sandbox exited)"]}
                detail |= self._revert_sandbox()
            else:
                self.sandbox.clear_shared()
        t2 = time.perf_counter()
        self._restore_files()
        self._restore_dock(reload=True)
        self._after_limit_hit(cap)
        t3 = time.perf_counter()
        detail |= self._start_bus()
        return {"kill_s": t1 - t0, "restore_s": t3 - t2, "killed": killed, **detail}

    def full_reset(self) -> dict[str, float]:
        """Restart Xvfb and openbox too, and start a clean sandbox (the local snapshot revert)."""
        t0 = time.perf_counter()
        cap = self.limit_hit()
        self._stop_bus()
        self.stop_x()
        if self.sandbox is not None:
            self.sandbox.stop()
        killed = self.kill_task_processes()
        self._restore_files()  # sandboxed, the new sandbox brings new /tmp and /run/user/1000
        self._restore_dock(reload=False)  # the panels start with the baseline's dock
        t1 = time.perf_counter()
        self.start_x()
        self._start_sandbox()
        self._after_limit_hit(cap)
        self._start_bus()
        t2 = time.perf_counter()
        return {"kill_restore_s": t1 - t0, "restart_s": t2 - t1, "killed": killed}

    def _revert_sandbox(self) -> dict[str, float]:
        assert self.sandbox is not None
        try:
            return self.sandbox.revert()
        except SandboxError as exc:
            raise SessionError(str(exc)) from None

    def _libreoffice_profile(self) -> Path | None:
        """The cached pre-built LibreOffice profile (:func:`.app_profiles.libreoffice_profile`),
        built now if this LibreOffice has none yet. When it cannot be built or cached: raises
        ``SessionError`` if ``prebuild`` asked for it, else logs a warning and answers ``None``
        (LibreOffice then creates its profile at each start, as without the option)."""
        try:
            return app_profiles.libreoffice_profile(self._baseline_env())
        except app_profiles.ProfileError as exc:
            if self.prebuild_asked:
                raise SessionError(f"prebuild libreoffice: {exc}") from None
            log.warning("no pre-built LibreOffice profile in the baseline HOME: %s", exc)
            return None

    def _baseline_env(self) -> dict[str, str]:
        """The task environment with HOME and the XDG folders in the baseline, no display."""
        base = str(self.baseline)
        env = self.task_env() | {
            "HOME": base,
            "XDG_CONFIG_HOME": f"{base}/.config",
            "XDG_CACHE_HOME": f"{base}/.cache",
            "XDG_DATA_HOME": f"{base}/.local/share",
            "XDG_STATE_HOME": f"{base}/.local/state",
        }
        env.pop("DISPLAY")
        return env

    def _restore_files(self) -> None:
        if self.sandbox is not None:
            self.sandbox.clean_homes()
        try:
            home_mod.restore(self.baseline, self.home)
        except RuntimeError as exc:
            raise SessionError(str(exc)) from None
        if self.sandbox is not None:
            if self.sandbox.alive():
                self._empty_sandbox_dirs()
            return
        self._fresh_private_dir(self.tmp)
        self._fresh_private_dir(self.run_dir)

    def _empty_sandbox_dirs(self) -> None:
        """Empty the running sandbox's ``/tmp`` and ``/run/user/1000`` in place (they are
        bound into it; its X socket mount point stays). Nothing is followed (:func:`empty_dir`);
        a replaced or re-moded directory made the sandbox dirty before (:meth:`.Sandbox.dirty`)."""
        assert self.sandbox is not None
        empty_dir(self.tmp, keep=(".X11-unix",))
        x_socket = os.path.basename(self.x_socket or "")
        empty_dir(self.tmp / ".X11-unix", keep=(x_socket,))  # its mount point stays
        empty_dir(self.run_dir)

    def _fresh_private_dir(self, path: Path) -> None:
        """An empty TMPDIR / XDG_RUNTIME_DIR of an unsandboxed desktop."""
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)


def _hold_abstract(number: int) -> socket.socket | None:
    """Bind display ``number``'s abstract socket name (``@/tmp/.X11-unix/X<n>``, in this
    process's network namespace: the host's) without listening, so that nothing else can bind
    it; ``None`` when it is taken already.

    Xvfb runs ``-nolisten local``, but libxcb (and so Xlib, mss, every app) tries the abstract
    name first and falls back to the socket file only on ``ECONNREFUSED``/``ENOENT``: with
    the name free, any process of the host's network namespace (a ``network=host`` sandbox
    included) could bind it, listen, and take this display's new clients. A bound socket
    that does not listen refuses every connection, so clients fall back to the file.
    The socket is close-on-exec (no child inherits it) and goes with this process."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"\0/tmp/.X11-unix/X{number}")
    except OSError:
        sock.close()
        return None
    return sock


def _free_display(number: int) -> int:
    """The first display number >= ``number`` that no live X server holds: no lock file, or
    one whose owner pid is dead (Xvfb replaces such a stale lock itself, atomically)."""
    while os.path.exists(f"/tmp/.X{number}-lock") and not _lock_is_stale(number):
        number += 1
    return number


def _lock_is_stale(number: int) -> bool:
    """True when display ``number``'s lock names a pid that no longer exists (a lock not
    readable, or naming a live pid, is not stale)."""
    owner = _lock_owner(number)
    if owner is None:
        return False
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _remove_display_files(number: int, pid: int) -> None:
    """Remove display ``number``'s lock file and socket if the lock still names ``pid``
    (our Xvfb, now dead): another server may have taken the number since."""
    if _lock_owner(number) != pid:
        return
    for path in (f"/tmp/.X11-unix/X{number}", f"/tmp/.X{number}-lock"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _lock_owner(number: int) -> int | None:
    """The pid in display ``number``'s X lock file (``None``: no lock, or not written yet)."""
    try:
        return int(Path(f"/tmp/.X{number}-lock").read_text().strip())
    except (OSError, ValueError):
        return None


def _wait_for_x(number: int, proc: subprocess.Popen, deadline: float) -> bool:
    """True once display ``number``'s socket accepts connections; False when Xvfb exited
    because the number was taken (another server holds its lock). Raises
    :class:`SessionError` when Xvfb cannot run or is not ready by ``deadline``."""
    path = f"/tmp/.X11-unix/X{number}"
    while True:
        code = proc.poll()
        if code is not None:
            if code == 1 and os.path.exists(f"/tmp/.X{number}-lock"):
                return False
            raise SessionError(
                f"Xvfb exited with {code} at start (is xvfb installed? see xvfb.log)"
            )
        # ready once the lock is ours (another server may answer on the same socket path
        # while our Xvfb is still finding out that the number is taken) and the socket answers
        if _lock_owner(number) == proc.pid:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(path)
                    return True
                except OSError:
                    pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SessionError(
                f"Xvfb was not ready on :{number} within {XVFB_TIMEOUT_S:.0f} s (see xvfb.log)"
            )
        time.sleep(0.002)


def _wait_for_panels(display: str, panels: Sequence[subprocess.Popen], timeout: float) -> None:
    """Poll until openbox's work area leaves room for every panel (their struts are in):
    ``_NET_WORKAREA`` starts right of the dock and below the top bar. Raises
    :class:`SessionError` when a panel exits or the work area stays whole."""
    from Xlib import X
    from Xlib import display as xdisplay

    d = xdisplay.Display(display)
    try:
        root = d.screen().root
        workarea = d.intern_atom("_NET_WORKAREA")
        deadline = time.monotonic() + timeout
        while True:
            prop = root.get_full_property(workarea, X.AnyPropertyType)
            if prop is not None and len(prop.value) >= 2:
                if prop.value[0] >= vm_look.DOCK_PX and prop.value[1] >= vm_look.TOP_BAR_PX:
                    return
            for panel in panels:
                if panel.poll() is not None:
                    raise SessionError(
                        f"tint2 exited with {panel.returncode} at start (see panels.log)"
                    )
            if time.monotonic() > deadline:
                raise SessionError(
                    f"the top bar and dock were not up within {timeout:.0f} s (see panels.log)"
                )
            time.sleep(0.005)
    finally:
        d.close()


def _wait_for_wm(display: str, wm: subprocess.Popen, timeout: float, paint: bool = False) -> None:
    """Poll until the WM sets ``_NET_SUPPORTING_WM_CHECK`` on the root window (~50 ms); then
    set the X resources and, with ``paint``, the root window's colour (:func:`.vm_look.paint_root`)."""
    from Xlib import X, Xatom
    from Xlib import display as xdisplay

    d = xdisplay.Display(display)
    try:
        root = d.screen().root
        check = d.intern_atom("_NET_SUPPORTING_WM_CHECK")
        deadline = time.monotonic() + timeout
        while root.get_full_property(check, X.AnyPropertyType) is None:
            if wm.poll() is not None:
                raise SessionError(f"openbox exited with {wm.returncode} at start (see wm.log)")
            if time.monotonic() > deadline:
                raise SessionError(f"openbox was not ready within {timeout:.0f} s (see wm.log)")
            time.sleep(0.005)
        root.change_property(
            d.intern_atom("RESOURCE_MANAGER"), Xatom.STRING, 8, X_RESOURCES.encode()
        )
        d.sync()
        if paint:
            vm_look.paint_root(d)
    finally:
        d.close()
