"""A desktop's session D-Bus and dconf: ``gsettings set`` persists, in HOME, as in OSWorld's VM.

Every local desktop runs one ``dbus-daemon --session`` as the desktop user (inside its sandbox
when it has one), listening on ``$XDG_RUNTIME_DIR/bus``: ``unix:path=/run/user/1000/bus`` in a
sandbox, the address OSWorld's configs export themselves (os task ``ec4e3f68``). Every process
of the desktop gets ``DBUS_SESSION_BUS_ADDRESS`` (setup commands, launched apps, ``/execute``,
evaluator commands), so GSettings uses Debian's dconf backend: ``dconf-service`` is started by
the bus on the first write and stores ``$XDG_CONFIG_HOME/dconf/user`` (``~/.config/dconf/user``),
which clients read directly. The database lives in HOME, so a fast reset (HOME restored from
the baseline) and a revert undo whatever a task set. The bus also activates the apps' own
services (``gnome-terminal-server``, nautilus, gvfs), which then share the desktop's bus.

Lifecycle: the daemon is infrastructure (``/legato/processes`` lists it under ``infra``), but
what it activates belongs to the task; the session stops the bus before every reset and starts
a fresh one after HOME is restored, so each attempt begins with a new bus, as after a login.

The baseline HOME gets a dconf database holding :data:`BASELINE_SETTINGS` (screen lock and
idle off, as OSWorld's VM), written through ``gsettings`` on a temporary bus of its own.

Without ``dbus-daemon`` or dconf (``dconf-service``, ``dconf-gsettings-backend``) a desktop
keeps the old behaviour: no bus, ``GSETTINGS_BACKEND=memory`` (writes are lost at once);
:func:`missing` says what to install. docs/local-desktop.md §10 has the measurements.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .procs import ProcessTable, RunAs, descendants, own_process_table

#: The socket's name in ``XDG_RUNTIME_DIR`` (where ``systemd --user`` puts a session bus).
SOCKET_NAME = "bus"
START_TIMEOUT_S = 10.0
GSETTINGS_TIMEOUT_S = 30.0
#: Files that must exist for a session bus with dconf (path -> Debian package).
REQUIRED_FILES = {
    "/usr/bin/dbus-daemon": "dbus-daemon",
    "/usr/libexec/dconf-service": "dconf-service",
    "/usr/share/dbus-1/services/ca.desrt.dconf.service": "dconf-service",
    "/usr/bin/gsettings": "libglib2.0-bin",
}
#: The GIO module of dconf, in any architecture's GIO module directory.
DCONF_GIO_MODULES = (
    "/usr/lib/*/gio/modules/libdconfsettings.so",
    "/usr/lib*/gio/modules/libdconfsettings.so",
)
#: Settings of the baseline HOME (schema, key, GVariant text): screen lock and idle off as in
#: OSWorld's VM. ``idle-dim`` keeps its default (true): os task bedcedc4 grades turning it off.
BASELINE_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("org.gnome.desktop.screensaver", "lock-enabled", "false"),
    ("org.gnome.desktop.screensaver", "idle-activation-enabled", "false"),
    ("org.gnome.desktop.session", "idle-delay", "uint32 0"),
)


class SessionBusError(RuntimeError):
    """The session bus or the baseline's dconf database could not be set up (says why)."""


def missing() -> list[str]:
    """Debian packages a session bus with dconf needs that are not installed (empty: none)."""
    packages = [pkg for path, pkg in REQUIRED_FILES.items() if not os.path.exists(path)]
    if not any(glob.glob(pattern) for pattern in DCONF_GIO_MODULES):
        packages.append("dconf-gsettings-backend")
    return list(dict.fromkeys(packages))


def bus_address(runtime_dir: str) -> str:
    """The D-Bus address of the session bus in ``runtime_dir`` (``XDG_RUNTIME_DIR``)."""
    return f"unix:path={runtime_dir.rstrip('/')}/{SOCKET_NAME}"


class SessionBus:
    """One ``dbus-daemon --session`` of a desktop, started and stopped by PID.

    Args:
      procs         the desktop's process table (spawns, kills and reaps)
      log_path      where the daemon's stdout/stderr go (appended)
    """

    def __init__(self, procs: ProcessTable, log_path: Path):
        self.procs = procs
        self.log_path = Path(log_path)
        self._proc: subprocess.Popen | None = None
        self._entered = False  # the Popen is the enter helper; the daemon is its child

    def start(self, run_as: RunAs, runtime_dir: str, host_runtime_dir: Path) -> float:
        """Start the daemon as ``run_as`` on ``<runtime_dir>/bus``; returns the seconds it took.

        ``runtime_dir`` is ``XDG_RUNTIME_DIR`` as the desktop's processes see it,
        ``host_runtime_dir`` the same directory on the host (where the socket is polled).
        ``run_as.env`` becomes the environment of every service the bus activates.
        Unsandboxed (no ``run_as.prefix``) the daemon gets SIGKILL when the calling thread
        ends (``setpriv --pdeathsig``): call it from a thread that lives as long as the bus
        should (the desktop server's X thread). Raises :class:`SessionBusError` when the socket
        does not answer within 10 s.
        """
        t0 = time.perf_counter()
        self.stop()
        host_socket = Path(host_runtime_dir) / SOCKET_NAME
        for stale in (host_socket, Path(host_runtime_dir) / "dconf"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            elif stale.exists() or stale.is_symlink():
                stale.unlink()
        address = bus_address(runtime_dir)
        env = dict(run_as.env, DBUS_SESSION_BUS_ADDRESS=address)
        run_as = RunAs(
            env=env, cwd=run_as.cwd, uid=run_as.uid, gid=run_as.gid, prefix=run_as.prefix
        )
        argv = ["dbus-daemon", "--session", "--nofork", "--nopidfile", f"--address={address}"]
        if not run_as.prefix:
            # unsandboxed: tied to the spawning thread (the server's X thread, which lives as
            # long as the server), so a server killed with SIGKILL takes its bus along; inside
            # a sandbox the sandbox's init does that (``tini -p SIGKILL``)
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        with open(self.log_path, "ab") as log:
            self._proc = self.procs.spawn(argv, run_as, stdout=log, stderr=log)
        self._entered = bool(run_as.prefix)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepts(host_socket):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise SessionBusError(
                    f"dbus-daemon exited with {code} at start (see {self.log_path.name})"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise SessionBusError(
                    f"the session bus did not answer on {address} within {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.002)
        return time.perf_counter() - t0

    def stop(self) -> None:
        """Kill the daemon and everything it activated (by PID), and reap them."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        root = proc.pid
        # the daemon outlives its enter helper for a moment and is then re-parented to the server:
        # keep selecting the pids found at first until they are gone and reaped
        first = {root} | descendants(root, own_process_table())
        try:
            self.procs.kill(lambda table: (first | descendants(root, table)) & set(table))
        except RuntimeError as exc:
            raise SessionBusError(f"stopping the session bus: {exc}") from None

    def alive(self) -> bool:
        """True while the daemon (or its enter helper) runs."""
        return self._proc is not None and self._proc.poll() is None

    def pids(self, table=None) -> set[int]:
        """The daemon's own host pids (with its enter helper), not the services it activated."""
        if self._proc is None:
            return set()
        table = table if table is not None else own_process_table()
        root = self._proc.pid
        if root not in table:
            return set()
        if not self._entered:
            return {root}
        return {root} | {pid for pid, info in table.items() if info.ppid == root}


def write_baseline_settings(
    procs: ProcessTable,
    run_as: RunAs,
    scratch: Path,
    settings: tuple[tuple[str, str, str], ...] = BASELINE_SETTINGS,
) -> None:
    """Store ``settings`` (schema, key, value) in the dconf database of ``run_as``'s HOME.

    ``run_as`` runs on the host with HOME and ``XDG_CONFIG_HOME`` pointing at the baseline;
    ``scratch`` (created, then removed) is the temporary bus's ``XDG_RUNTIME_DIR``, owned by
    ``run_as``'s uid; the bus logs to ``<scratch>.log`` beside it. Raises :class:`SessionBusError` naming the setting that failed.
    """
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(mode=0o700, parents=True)
    if run_as.uid is not None:
        os.chown(scratch, run_as.uid, run_as.gid if run_as.gid is not None else run_as.uid)
    env = dict(run_as.env, XDG_RUNTIME_DIR=str(scratch))
    env.pop("GSETTINGS_BACKEND", None)
    run_as = RunAs(env=env, cwd=run_as.cwd, uid=run_as.uid, gid=run_as.gid)
    bus = SessionBus(procs, scratch.parent / f"{scratch.name}.log")
    try:
        bus.start(run_as, str(scratch), scratch)
        env = dict(env, DBUS_SESSION_BUS_ADDRESS=bus_address(str(scratch)))
        with_bus = RunAs(env=env, cwd=run_as.cwd, uid=run_as.uid, gid=run_as.gid)
        for schema, key, value in settings:
            done = procs.run(
                ["gsettings", "set", schema, key, value], with_bus, timeout=GSETTINGS_TIMEOUT_S
            )
            if done.returncode != 0:
                raise SessionBusError(
                    f"baseline setting {schema} {key} {value}: "
                    f"{done.stderr.decode(errors='replace').strip()}"
                )
    except subprocess.TimeoutExpired:
        raise SessionBusError(
            f"baseline settings: gsettings did not finish within {GSETTINGS_TIMEOUT_S:.0f} s"
        ) from None
    finally:
        bus.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def _accepts(path: Path) -> bool:
    """True when a Unix socket at ``path`` accepts a connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
            return True
        except OSError:
            return False
