"""One desktop session: Xvfb + openbox + the desktop user's HOME + the task's processes.

Layout of the state directory (one per desktop server)::

    baseline/   the clean HOME, built once at start (blink off, XDG folders)
    home/       the live HOME of the desktop user (restored from baseline on reset)
    run/        XDG_RUNTIME_DIR (0700, the desktop user's)
    tmp/        TMPDIR of the task's processes (emptied on reset)
    wm/         HOME of the window manager (its config and cache stay out of the task's HOME)
    apps.log    stdout/stderr of the task's processes; xvfb.log, wm.log of the infrastructure

When the server runs as root, task processes run as an unprivileged user (``legato-desktop``
by default, created with ``useradd`` if missing). Xvfb and openbox run as the server itself
under ``setpriv --pdeathsig KILL``, so they die with it even when it is SIGKILLed; X apps then
exit because their display is gone.

Timings this is built on (docs/local-desktop.md §3, §7): Xvfb ready ~50 ms via ``-displayfd``,
openbox ready ~50 ms, kill + verify ~40 ms, ``rm -rf`` + ``cp -a`` ~13 ms.
"""

from __future__ import annotations

import os
import pwd
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

from . import home as home_mod
from .procs import ProcessTable, RunAs, descendants, process_table

DESKTOP_USER = "legato-desktop"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: X resources set on the root window: a scalable xterm font (no "cannot load font" warning,
#: docs/local-desktop.md §9) and no blinking cursors.
X_RESOURCES = "XTerm*faceName: DejaVu Sans Mono\nXTerm*faceSize: 11\n*cursorBlink: false\n"
XVFB_TIMEOUT_S = 10.0
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


def openbox_config() -> str:
    """The system openbox ``rc.xml`` with one desktop and no root-window menus.

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
    return text


class Session:
    """Xvfb, window manager, HOME and processes of one desktop. Not thread-safe: call it from
    one long-lived thread (Xvfb's parent-death signal fires when the spawning *thread* exits).

    Args:
      width, height  screen size in pixels
      state_dir      the directory laid out as in the module docstring (created if missing)
      user           desktop user when running as root (``None``: run everything as ourselves)
      template       a directory copied into the baseline HOME (e.g. pre-built app profiles)
      prebuild       apps whose profile is built into the baseline at start (``libreoffice``:
                     ~0.3 s once; a GUI launch then skips creating its profile)
    """

    def __init__(
        self,
        *,
        width: int,
        height: int,
        state_dir: Path,
        user: str | None = DESKTOP_USER,
        template: Path | None = None,
        prebuild: tuple[str, ...] = (),
    ):
        unknown = set(prebuild) - set(PREBUILD_APPS)
        if unknown:
            raise SessionError(
                f"cannot pre-build profiles of {sorted(unknown)}; known: {sorted(PREBUILD_APPS)}"
            )
        self.prebuild = tuple(prebuild)
        self.width, self.height = width, height
        self.state = Path(state_dir)
        self.template = template
        self.procs = ProcessTable()
        if os.geteuid() == 0 and user:
            self.user = user
            self.uid, self.gid = ensure_user(user)
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
            self.uid = self.gid = None
        self.baseline = self.state / "baseline"
        self.home = self.state / "home"
        self.run_dir = self.state / "run"
        self.tmp = self.state / "tmp"
        self.wm_home = self.state / "wm"
        self.display: str | None = None
        self._xvfb: subprocess.Popen | None = None
        self._wm: subprocess.Popen | None = None
        self.generation = 0  # bumped on every X (re)start; X clients reconnect when it changes

    # -- environment -------------------------------------------------------------------------

    def task_env(self) -> dict[str, str]:
        """The environment of every task process (built from scratch, nothing inherited).

        ``NO_AT_BRIDGE``/``GTK_A11Y``/``GSETTINGS_BACKEND=memory`` keep GTK apps from
        autolaunching at-spi, dconf and dbus helpers that outlive them (docs/local-desktop.md §9).
        """
        home = str(self.home)
        return {
            "HOME": home,
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/bash",
            "PATH": SYSTEM_PATH,
            "LANG": "C.UTF-8",
            "DISPLAY": self.display or "",
            "XDG_SESSION_TYPE": "x11",
            "XDG_RUNTIME_DIR": str(self.run_dir),
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_STATE_HOME": f"{home}/.local/state",
            "TMPDIR": str(self.tmp),
            "NO_AT_BRIDGE": "1",
            "GTK_A11Y": "none",
            "GSETTINGS_BACKEND": "memory",
        }

    def run_as(self) -> RunAs:
        """How task, setup and evaluator processes run: the desktop user, in its HOME."""
        return RunAs(env=self.task_env(), cwd=str(self.home), uid=self.uid, gid=self.gid)

    def _infra_run_as(self) -> RunAs:
        env = {"HOME": str(self.wm_home), "PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
        if self.display:
            env["DISPLAY"] = self.display
        return RunAs(env=env, cwd=str(self.wm_home))

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Prepare the state directory, build the baseline HOME, start Xvfb and openbox."""
        self.state.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o711)  # the desktop user must traverse it to reach its HOME
        for path in (self.run_dir, self.tmp):
            self._fresh_private_dir(path)
        self.wm_home.mkdir(exist_ok=True)
        (self.wm_home / ".config" / "openbox").mkdir(parents=True, exist_ok=True)
        (self.wm_home / ".config" / "openbox" / "rc.xml").write_text(openbox_config())
        home_mod.build_baseline(self.baseline, uid=self.uid, gid=self.gid, template=self.template)
        if "libreoffice" in self.prebuild:
            self._prebuild_libreoffice()
        home_mod.restore(self.baseline, self.home)
        self.start_x()

    def start_x(self) -> None:
        """Start Xvfb (``-displayfd``: it picks a free display and reports it) and openbox.

        Raises :class:`SessionError` when either is not ready within 10 s.
        """
        read_fd, write_fd = os.pipe()
        log = open(self.state / "xvfb.log", "ab")
        try:
            self._xvfb = self.procs.spawn(
                [
                    "setpriv",
                    "--pdeathsig",
                    "KILL",
                    "--",
                    "Xvfb",
                    "-displayfd",
                    str(write_fd),
                    "-screen",
                    "0",
                    f"{self.width}x{self.height}x24",
                    "-nolisten",
                    "tcp",
                    "-noreset",
                ],
                self._infra_run_as(),
                stderr=log,
                stdout=log,
                pass_fds=[write_fd],
            )
            os.close(write_fd)
            self.display = ":" + _read_display(read_fd, self._xvfb, XVFB_TIMEOUT_S)
        finally:
            os.close(read_fd)
            log.close()
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
        _wait_for_wm(self.display, self._wm, WM_TIMEOUT_S)
        self.generation += 1

    def stop_x(self) -> None:
        """Kill openbox and Xvfb (by PID) and reap them."""
        for proc in (self._wm, self._xvfb):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self._wm = self._xvfb = None
        self.procs.reap()

    def alive(self) -> bool:
        """True while Xvfb and the window manager both run."""
        return all(p is not None and p.poll() is None for p in (self._xvfb, self._wm))

    def close(self) -> None:
        """Kill every process of the desktop (tasks and infrastructure)."""
        me = os.getpid()
        self.stop_x()
        self.procs.kill(lambda table: descendants(me, table))

    # -- the task's processes ---------------------------------------------------------------

    def infra_pids(self, table) -> set[int]:
        """Xvfb, the window manager and anything below them."""
        pids: set[int] = set()
        for proc in (self._xvfb, self._wm):
            if proc is not None and proc.pid in table:
                pids.add(proc.pid)
                pids |= descendants(proc.pid, table)
        return pids

    def task_pids(self, table=None) -> set[int]:
        """Every process of the task: the server's descendants minus the infrastructure."""
        table = table if table is not None else process_table()
        return descendants(os.getpid(), table) - self.infra_pids(table)

    def kill_task_processes(self) -> int:
        """Kill the task's processes, verify none survived, reap. Returns how many were killed.

        Raises :class:`SessionError` naming any survivor.
        """
        try:
            return len(self.procs.kill(self.task_pids))
        except RuntimeError as exc:
            raise SessionError(str(exc)) from None

    # -- reset ---------------------------------------------------------------------------------

    def fast_reset(self) -> dict[str, float]:
        """Kill the task's processes and restore HOME and TMPDIR. Returns step timings (s)."""
        t0 = time.perf_counter()
        killed = self.kill_task_processes()
        t1 = time.perf_counter()
        self._restore_files()
        t2 = time.perf_counter()
        return {"kill_s": t1 - t0, "restore_s": t2 - t1, "killed": killed}

    def full_reset(self) -> dict[str, float]:
        """Restart Xvfb and openbox too (the local analogue of a snapshot revert)."""
        t0 = time.perf_counter()
        self.stop_x()
        killed = self.kill_task_processes()
        self._restore_files()
        t1 = time.perf_counter()
        self.start_x()
        t2 = time.perf_counter()
        return {"kill_restore_s": t1 - t0, "restart_s": t2 - t1, "killed": killed}

    def _prebuild_libreoffice(self) -> None:
        """Create a LibreOffice profile in the baseline (headless, no display needed)."""
        if shutil.which("soffice") is None:
            raise SessionError(
                "prebuild libreoffice: soffice is not installed (apt-get install libreoffice-calc)"
            )
        base = str(self.baseline)
        env = self.task_env() | {
            "HOME": base,
            "XDG_CONFIG_HOME": f"{base}/.config",
            "XDG_CACHE_HOME": f"{base}/.cache",
            "XDG_DATA_HOME": f"{base}/.local/share",
            "XDG_STATE_HOME": f"{base}/.local/state",
        }
        env.pop("DISPLAY")
        run_as = RunAs(env=env, cwd=base, uid=self.uid, gid=self.gid)
        try:
            self.procs.run(
                ["soffice", "--headless", "--norestore", "--terminate_after_init"],
                run_as,
                timeout=120,
            )
        except subprocess.TimeoutExpired:
            raise SessionError(
                "prebuild libreoffice: soffice did not finish within 120 s"
            ) from None
        self.kill_task_processes()
        try:
            home_mod.add_libreoffice_settings(self.baseline)
        except FileNotFoundError:
            raise SessionError("prebuild libreoffice: soffice did not create a profile") from None

    def _restore_files(self) -> None:
        try:
            home_mod.restore(self.baseline, self.home)
        except RuntimeError as exc:
            raise SessionError(str(exc)) from None
        self._fresh_private_dir(self.tmp)

    def _fresh_private_dir(self, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.gid)


def _read_display(fd: int, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            proc.kill()
            raise SessionError(
                f"Xvfb did not report its display within {timeout:.0f} s (see xvfb.log)"
            )
        chunk = os.read(fd, 64)
        if not chunk:
            raise SessionError(
                f"Xvfb exited with {proc.wait()} before reporting its display (is xvfb installed? see xvfb.log)"
            )
        data += chunk
    return data.decode().strip()


def _wait_for_wm(display: str, wm: subprocess.Popen, timeout: float) -> None:
    """Poll until the WM sets ``_NET_SUPPORTING_WM_CHECK`` on the root window (~50 ms)."""
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
    finally:
        d.close()
