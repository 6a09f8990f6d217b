"""A local desktop's sandbox: Linux namespaces that make it look like OSWorld's VM.

Every process of the task (apps, setup and evaluator commands, whatever the policy starts)
runs in the desktop's own user, mount, pid and ipc namespaces (and optionally its own network
namespace: nothing but a loopback, or connected by passt's ``pasta`` with a route out and
per-desktop host ports forwarded to its Chrome and VLC ports), built with util-linux's
``unshare``, and entered through :mod:`.enter` (the host's Python: ``setns``, bounding set and
user set before anything of the sandbox's root runs); no container runtime. The ipc namespace
is, for a desktop's sandboxes (``Sandbox.start(ipc_ns=)``), its X server's, which they all
join, so that MIT-SHM works and the X server sees no host segment. Inside (docs/sandbox.md has
the whole picture):

- account ``user`` (uid 1000), HOME ``/home/user``, password ``password`` (OSWorld's
  ``{CLIENT_PASSWORD}``), ``sudo -S`` accepting it: root *inside the sandbox only*;
- the root filesystem is the host's ``/etc``, ``/usr``, ``/var``, ``/opt`` read through
  overlayfs, each with a per-desktop writable upper layer (``upper/``) beside the state
  directory; ``/home`` holds only this desktop's HOME; ``/tmp`` and ``XDG_RUNTIME_DIR`` are
  the desktop's own directories; ``/root`` is empty; everything else of the host (``/root``,
  ``/work``, other desktops, run directories, the policy key) is simply not there;
- a fresh ``/proc`` of its own pid namespace: host processes are invisible; ``/dev`` holds
  only ``null zero full random urandom tty``, a private ``pts``, ``shm`` and ``mqueue``;
- host-wide knobs read-only: ``/proc/sys`` and the rest of :data:`PROC_READONLY`, ``/sys``
  and every mount below it (cgroups); kernel internals masked (:data:`PROC_MASKED`,
  :data:`SYS_MASKED`);
- no process inside holds :data:`CAPS_DROPPED` (``sys_admin``, ``setfcap``...): they are
  dropped from the bounding set of the init and of every process entered, so ``sudo`` cannot
  give them back, and nothing inside can mount, remount, or map uid 0 into a user namespace;
- the X display through its socket file alone (the X server listens on no abstract socket,
  so one sandbox cannot reach another desktop's display).

Revert is dropping the sandbox: killing its pid namespace's init kills every process in it,
the upper layers are emptied, and a clean sandbox takes over: a spare started in the background
beforehand, so the revert costs milliseconds (a cold start takes ~70 ms).
A non-empty upper layer (:meth:`Sandbox.dirty`) says the task changed the system outside
HOME, so the next reset must revert.

Why these choices (measured on Debian bookworm, kernel 6.x, as root):

- uid maps: the sandbox maps uids/gids ``0..65535`` to the *same* host ids, written by the
  server itself (root may write any map). Identity maps are what make the host's
  root-owned ``sudo`` and ``/etc/sudoers`` work inside; the cost is that root inside is host
  uid 0 for permission checks on whatever it reaches, which is why nothing writable of the
  host is bound in (the overlays' lower layers cannot be written through the overlay), the
  host-wide knobs are read-only and the capabilities above are gone; and that uid 1000
  inside is the host's, which is why ``sandbox/`` is 0700 on the host.
- bubblewrap was tried first: it always sets ``no_new_privs`` and mounts its binds
  ``nosuid``, so ``sudo`` cannot work inside a bubblewrap sandbox; and Debian bookworm's
  bubblewrap (0.8) has no overlay option.
- ``pivot_root`` (not ``chroot``): the kernel refuses new user namespaces to chrooted
  processes, and Chromium builds its own sandbox from user namespaces.

Namespaces are not a VM boundary: a kernel exploit inside escapes, as from any container.
"""

from __future__ import annotations

import os
import select
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the module itself is stdlib only (check_support runs from its source)
    from .procs import ProcInfo

#: The account OSWorld's VM has, and its HOME (paths in task configs and evaluators name it).
SANDBOX_USER = "user"
SANDBOX_UID = 1000
SANDBOX_HOME = "/home/user"
#: OSWorld's ``{CLIENT_PASSWORD}``; sudo inside the sandbox accepts it.
SANDBOX_PASSWORD = "password"
#: ``openssl passwd -6 -salt legatodesktop password`` (SHA-512 crypt of SANDBOX_PASSWORD).
PASSWORD_HASH = (
    "$6$legatodesktop$c5kJS.t8vkEh5Ut.HplxuWW70CavyAfRhpwyzxdAy3xIRXI7PxvkGPC4DNYDMUqkDt0Q"
    ".aoIChYtaYYj9N3L.."
)
#: Host directories seen inside through an overlay with a per-desktop upper layer.
OVERLAID = ("etc", "usr", "var", "opt")
#: uid/gid range mapped one to one (host id = sandbox id).
ID_MAP = "0 0 65536\n"
START_TIMEOUT_S = 10.0
#: passt's ``pasta`` (Debian package ``passt``): connects a sandbox's own network namespace.
PASTA = "pasta"
TOOLS = ("unshare", "nsenter", "setpriv", "findmnt", "mount", "tini", "sudo")
#: The host's interpreter (an absolute path) that runs ``enter.py`` to enter a sandbox or start
#: its init: host code drops every privilege before anything of the sandbox's root runs.
HOST_PYTHON = os.path.realpath(sys.executable)
#: Capabilities dropped from the bounding set of the sandbox's init and of every process
#: entered, so that not even root inside (``sudo``) can hold them. ``sys_admin``: no mount or
#: remount (``/proc/sys``, ``/sys`` stay read-only, nothing mounted inside outlives a reset);
#: ``setfcap``: root inside cannot map uid 0 into a user namespace of its own (the kernel asks
#: for it), so it cannot become host-uid-0-with-all-capabilities there; ``sys_ptrace``: no
#: reading or tracing of processes it does not own; the rest are no use inside and
#: dangerous if the kernel ever honoured them there.
CAPS_DROPPED = (
    "sys_admin",
    "setfcap",
    "sys_ptrace",
    "sys_module",
    "sys_rawio",
    "sys_boot",
    "sys_time",
    "mknod",
    "syslog",
    "mac_admin",
    "mac_override",
    # the sandbox's own network namespace (links, addresses, routes: kernel state no revert
    # undoes); pasta and the setup configure it from the host
    "net_admin",
)
#: Default size limit of each of the sandbox's tmpfs mounts that a task can fill (``/dev/shm``,
#: ``/run``, ``/root``; the kernel's default is half the RAM each). ``Sandbox(tmpfs_size=)``.
TMPFS_SIZE = "1g"
#: Size limit of the tmpfs mounts holding only mount points (the root, ``/dev``).
SMALL_TMPFS = "16m"
#: ``/proc`` entries bound read-only over themselves (host-wide knobs that the identity uid
#: map would let root inside write: sysctls, ``sysrq-trigger``, irq affinities...).
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
#: ``/proc`` entries hidden (``/dev/null`` over files, an empty read-only tmpfs over
#: directories), Docker's list: kernel memory, keyrings, timers, scheduler internals.
PROC_MASKED = (
    "kcore",
    "keys",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "acpi",
    "asound",
    "scsi",
)
#: ``/sys`` directories hidden (firmware tables, energy counters).
SYS_MASKED = ("firmware", "devices/virtual/powercap")

# Runs as root inside the new user + mount + pid namespaces (pid 1 of the new pid namespace),
# after the server has written the uid/gid maps (it writes a line on stdin when done).
SETUP_SCRIPT = r"""
set -eu
read -r _ || exit 3
R="$LAYERS/root"
mount -t tmpfs -o "mode=0755,size=$SMALL_TMPFS" legato-root "$R"
for d in $OVERLAID; do
  [ -d "/$d" ] || continue
  mkdir -p "$R/$d"
  lower="/$d"; [ -d "$SB/seed/$d" ] && lower="$SB/seed/$d:/$d"
  mount -t overlay "legato-$d" -o "lowerdir=$lower,upperdir=$LAYERS/upper/$d,workdir=$LAYERS/work/$d,userxattr" "$R/$d"
done
# binds of host inodes are read-only: root inside is host uid 0 for permission checks, and
# would otherwise chmod, chown or rewrite the host's own file (writes to a device node and
# connect() to a socket still work on a read-only mount)
for b in $BINDS; do
  mount --bind "${b%%:*}" "$R/${b#*:}"; mount -o remount,bind,ro,nosuid "$R/${b#*:}"
done
for l in bin sbin lib lib32 lib64 libx32; do [ -L "/$l" ] && ln -s "$(readlink "/$l")" "$R/$l"; done
mkdir -p "$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/home" "$R/root" "$R/run" "$R/mnt" "$R/media" "$R/srv" "$R/.old"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
# a shared ipc namespace (the X server's) was set up by the server, and is not ours to set
if [ "$OWN_IPC" = 1 ]; then echo 1 > "$R/proc/sys/kernel/shm_rmid_forced"; fi
for p in $PROC_READONLY; do
  [ -e "$R/proc/$p" ] || continue
  mount --bind "$R/proc/$p" "$R/proc/$p"; mount -o remount,bind,ro "$R/proc/$p"
done
for p in $PROC_MASKED; do
  if [ -d "$R/proc/$p" ]; then mount -t tmpfs -o ro,mode=0555 legato-masked "$R/proc/$p"
  elif [ -e "$R/proc/$p" ]; then
    # read-only: a writable bind of the host's /dev/null would let root inside chmod it
    mount --bind /dev/null "$R/proc/$p"; mount -o remount,bind,ro,nosuid,noexec "$R/proc/$p"
  fi
done
mount --rbind /sys "$R/sys"
for p in $SYS_MASKED; do
  [ -d "$R/sys/$p" ] && mount -t tmpfs -o ro,mode=0555 legato-masked "$R/sys/$p"
done
findmnt -R -n -r -o TARGET "$R/sys" | while read -r m; do mount -o remount,bind,ro "$m"; done
mount -t tmpfs -o "mode=0755,nosuid,size=$SMALL_TMPFS" dev "$R/dev"
for n in null zero full random urandom tty; do
  touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"
  mount -o remount,bind,ro,nosuid,noexec "$R/dev/$n"
done
mkdir "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
mount -t tmpfs -o "mode=1777,nosuid,nodev,size=$TMPFS_SIZE" shm "$R/dev/shm"
# in a shared ipc namespace only its owner (host root) may mount its mqueue: the server
# empties the X server's mount of it instead (Sandbox.clear_shared)
if [ "$OWN_IPC" = 1 ]; then mount -t mqueue -o nosuid,nodev,noexec mqueue "$R/dev/mqueue"; fi
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mount --bind "$SB/homes" "$R/home"
mount --bind "$LAYERS/tmp" "$R/tmp"
mount -t tmpfs -o "mode=0700,size=$TMPFS_SIZE" legato-root-home "$R/root"
mount -t tmpfs -o "mode=0755,nosuid,nodev,size=$TMPFS_SIZE" legato-run "$R/run"
mkdir "$R/run/user" "$R/run/user/$UID_IN"
mount --bind "$LAYERS/run" "$R/run/user/$UID_IN"
if [ -n "$X_SOCKET" ]; then
  # the mount point was made by the server in this sandbox's own fresh tmp/ (nothing else
  # has ever reached it); a link there is refused all the same
  x="$R/tmp/.X11-unix/$(basename "$X_SOCKET")"
  [ -f "$x" ] && [ ! -L "$x" ] && [ ! -L "$R/tmp/.X11-unix" ] || { echo "bad X mount point" >&2; exit 4; }
  mount --bind "$X_SOCKET" "$x"; mount -o remount,bind,ro,nosuid,noexec,nodev "$x"
fi
if [ "$OWN_NET" = 1 ]; then ip link set lo up; fi
cd "$R"
# the host's Python (enter.py): pivot_root, old root detached, bounding set dropped, and only
# then tini from the new root (nothing of it runs or is loaded with more than that set)
eval "exec $INIT_ARGV"
"""


class SandboxError(RuntimeError):
    """The sandbox cannot be built here, or did not start; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class SandboxSupport:
    """Whether this host can build sandboxes: ``ok``, else ``problem`` says what is missing
    and how to fix it."""

    ok: bool
    problem: str = ""


def check_support() -> SandboxSupport:
    """Can this process build desktop sandboxes? (root, user namespaces, the tools).

    Sandboxes need root on the host (only root may write the uid maps that give the sandbox
    both ``user`` and a working ``sudo``), user namespaces enabled, and util-linux, tini and
    sudo installed.
    """
    if os.geteuid() != 0:
        return SandboxSupport(
            False,
            "sandboxed local desktops need root on the host (it writes the sandbox's uid maps);"
            " run the desktop server as root, or pass --desktop-option sandbox=false to run"
            " desktops unsandboxed (the policy can then read what the desktop user can read"
            " on this host)",
        )
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return SandboxSupport(
            False,
            f"sandboxed local desktops need {', '.join(missing)}: apt-get install util-linux"
            " tini sudo (scripts/setup.sh installs them)",
        )
    try:
        limit = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except (OSError, ValueError):
        limit = 1
    if limit == 0:
        return SandboxSupport(
            False,
            "user namespaces are disabled on this host (/proc/sys/user/max_user_namespaces is 0):"
            " enable them with `sysctl -w user.max_user_namespaces=15000`, or pass"
            " --desktop-option sandbox=false to run desktops unsandboxed",
        )
    return SandboxSupport(True)


def _seed_files() -> dict[str, tuple[str, int]]:
    """Files laid over the host's ``/etc`` (path -> (text, mode)): the ``user`` account
    (replacing any host account with its name or uid 1000), a shadow file holding only
    locked entries and ``user``'s password, and a sudoers entry for ``user``."""

    def without_user(path: str) -> list[str]:
        lines = Path(path).read_text().splitlines()
        return [
            line
            for line in lines
            if line.count(":") >= 3
            and line.split(":")[0] != SANDBOX_USER
            and line.split(":")[2] != str(SANDBOX_UID)
        ]

    passwd = without_user("/etc/passwd")
    group = without_user("/etc/group")
    uid = SANDBOX_UID
    passwd.append(f"{SANDBOX_USER}:x:{uid}:{uid}:{SANDBOX_USER}:{SANDBOX_HOME}:/bin/bash")
    group.append(f"{SANDBOX_USER}:x:{uid}:")
    shadow = [f"{line.split(':')[0]}:*:19000:0:99999:7:::" for line in passwd[:-1]]
    shadow.append(f"{SANDBOX_USER}:{PASSWORD_HASH}:19000:0:99999:7:::")
    return {
        "etc/passwd": ("\n".join(passwd) + "\n", 0o644),
        "etc/group": ("\n".join(group) + "\n", 0o644),
        "etc/shadow": ("\n".join(shadow) + "\n", 0o640),
        # lecture=never: sudo would otherwise write /var/lib/sudo/lectured/ on first use,
        # and every task using sudo would force a revert (its timestamps in /run are cleared)
        "etc/sudoers.d/legato-user": (
            f"Defaults:{SANDBOX_USER} lecture=never\n{SANDBOX_USER} ALL=(ALL:ALL) ALL\n",
            0o440,
        ),
    }


@dataclass
class _Instance:
    """One running set of namespaces: its layer directory, ``unshare`` process, the init's
    pid and the pid of the init's one child (``sleep infinity``), both read once at start."""

    layers: Path
    anchor: subprocess.Popen
    init_pid: int
    sleep_pid: int
    #: :func:`.leftovers.attributes` of the watched places, read before any task ran
    attrs: dict = field(default_factory=dict)
    #: ``pasta`` connecting the network namespace (only while this sandbox is the running one)
    pasta: subprocess.Popen | None = None

    def stop(self) -> int | None:
        """SIGKILL the pid namespace's init (the kernel kills every process in it) and
        ``pasta`` (its host ports are free once this returns), reap. Returns a pidfd of the
        init, opened before the kill, while it is still ending (it outlives ``unshare`` until
        the kernel has killed its namespace, re-parented to the server): the caller closes
        it; ``None`` when it ended already (:meth:`Sandbox.anchor_pids` keeps it the
        sandbox's meanwhile)."""
        self.stop_pasta()
        try:
            init_fd: int | None = os.pidfd_open(self.init_pid)
        except OSError:  # gone already
            init_fd = None
        try:
            os.kill(self.init_pid, 9)
        except ProcessLookupError:
            pass
        if self.anchor.poll() is None:
            self.anchor.kill()
        self.anchor.wait()
        for stream in (self.anchor.stdout, self.anchor.stderr):
            if stream is not None:
                stream.close()
        if init_fd is not None and _exited(init_fd):
            os.close(init_fd)
            init_fd = None
        return init_fd

    def stop_pasta(self) -> None:
        if self.pasta is not None:
            if self.pasta.poll() is None:
                self.pasta.kill()
            self.pasta.wait()
            if self.pasta.stderr is not None:
                self.pasta.stderr.close()
            self.pasta = None

    def pids(self) -> set[int]:
        """``unshare``, the init, the init's ``sleep`` and ``pasta`` (host pids). Whatever else
        runs below the init (orphans of the task re-parented to it) is the task's."""
        pids = {self.anchor.pid, self.init_pid, self.sleep_pid}
        pasta = self.pasta  # read once: stop_pasta() on another thread clears it
        return pids | ({pasta.pid} if pasta is not None else set())


class Sandbox:
    """The namespaces of one desktop, rooted at ``state/sandbox``.

    Layout::

        sandbox/                     0700, root's: no host user reaches anything below
        sandbox/seed/etc/            passwd, group, shadow, sudoers.d/ (lower layer over /etc)
        sandbox/homes/user/          HOME, seen inside as /home/user
        sandbox/layers-N/upper/D/    what the task wrote under /D (D in etc usr var opt)
        sandbox/layers-N/work/D/     overlayfs work directories
        sandbox/layers-N/root/       mount point of the sandbox's root (empty on the host)
        sandbox/layers-N/tmp/, run/  seen inside as /tmp and /run/user/1000: made new for
                                     every sandbox (never shared between the running one
                                     and its spare, nor reused)

    Double buffering: besides the running sandbox, a *spare* one is started in the background
    on the other ``layers-N`` with clean layers (``spare=True``, the default), so a revert
    is killing the running one and switching to the spare (~5 ms on the critical path instead
    of ~70 ms); the next spare then starts in the background. A spare costs two sleeping
    processes and its mounts.

    Args:
      state        the desktop's state directory
      network      ``True``: the host's network (as an unsandboxed desktop); ``False``: a
                   network namespace of its own with only a loopback (no route out)
      forward      with ``network=False``: connect the namespace with ``pasta`` (a route out
                   through the host's sockets) and forward ``127.0.0.1:<host port>`` on the
                   host to ``127.0.0.1:<port>`` inside, as ``{port inside: host port}``
                   (e.g. ``{9222: 41234, 8080: 41235}``: OSWorld's CDP bridge and VLC ports).
                   ``pasta`` runs for the running sandbox only (a spare cannot hold the same
                   host ports): a revert starts it anew (~20 ms)
      spare        keep a clean spare sandbox ready for the next revert
      tmpfs_size   size limit of each of ``/dev/shm``, ``/run``, ``/root`` (tmpfs ``size=``)
      browser_flags flags the ``google-chrome`` wrapper adds (:mod:`.chrome`: a proxy)
      limits       the desktop's resource caps (:class:`.limits.DesktopLimits`: a cgroup the
                   sandbox's init and every process entered join before they run anything,
                   and a size-capped filesystem mounted on ``sandbox/``); ``None``: uncapped

    Call it from one thread (the session's X thread); sandboxes are started on a worker thread
    of their own that lives as long as this object (``setpriv --pdeathsig`` fires when the
    thread that started a process exits).
    """

    def __init__(
        self,
        state: Path,
        *,
        network: bool = True,
        forward: dict[int, int] | None = None,
        spare: bool = True,
        tmpfs_size: str = TMPFS_SIZE,
        limits=None,
        browser_flags: Sequence[str] = (),
    ):
        if forward and network:
            raise SandboxError("forward needs a network namespace of its own (network=False)")
        if forward and shutil.which(PASTA) is None:
            raise SandboxError(
                "a desktop network of its own with forwarded ports needs pasta"
                " (apt-get install passt)"
            )
        self.dir = Path(state) / "sandbox"
        self.network = network
        self.forward = dict(forward or {})
        self.keep_spare = spare
        self.tmpfs_size = tmpfs_size
        self.limits = limits  # .limits.DesktopLimits | None
        self.browser_flags = tuple(browser_flags)
        self.home = self.dir / "homes" / SANDBOX_USER
        self._active: _Instance | None = None
        self._spare: Future | None = None
        self._spare_layers = self.dir / "layers-1"
        self._x_socket: str | None = None
        self._ipc_fd: int | None = None  # the shared ipc namespace (our own dup), or None
        self._mqueue_fd: int | None = None  # its POSIX message queue directory (our dup)
        self._worker: ThreadPoolExecutor | None = None
        self._starting: set[int] = (
            set()
        )  # unshare pids of sandboxes not yet running (starting, or the spare)
        #: held while a sandbox's first process is forked and until its pid is in
        #: :attr:`_starting` (:meth:`process_table` waits for it)
        self._spawning = threading.Lock()
        #: stopped sandboxes' inits still ending: ``(pid, pidfd)`` (:meth:`_Instance.stop`)
        self._dying: list[tuple[int, int]] = []
        self._dying_lock = threading.Lock()

    @property
    def init_pid(self) -> int | None:
        """Host pid of the running sandbox's init (``None`` when none runs)."""
        return self._active.init_pid if self._active is not None else None

    @property
    def tmp_dir(self) -> Path | None:
        """Host directory seen inside the running sandbox as ``/tmp`` (its own: every sandbox
        gets a new one; the session empties it on a fast reset); ``None`` when none runs."""
        return self._active.layers / "tmp" if self._active is not None else None

    @property
    def run_dir(self) -> Path | None:
        """Host directory seen inside the running sandbox as ``/run/user/1000``
        (``XDG_RUNTIME_DIR``; a new one for every sandbox too); ``None`` when none runs."""
        return self._active.layers / "run" if self._active is not None else None

    # -- lifecycle -----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Lay out the sandbox directory (seed files). Raises :class:`SandboxError` when this
        host cannot build sandboxes (:func:`check_support`)."""
        support = check_support()
        if not support.ok:
            raise SandboxError(support.problem)
        if self.limits is not None:  # the disk cap: sandbox/ is a size-capped filesystem
            from .limits import LimitsError

            try:
                self.limits.setup()
            except LimitsError as exc:
                raise SandboxError(str(exc)) from None
        self.dir.mkdir(parents=True, exist_ok=True)
        # 0700: uid 1000 inside is the host's uid 1000, so the host's uid 1000 must find no
        # way into HOME (inside, /home is a mount of homes/: nothing above it is traversed)
        os.chmod(self.dir, 0o700)
        (self.dir / "homes").mkdir(exist_ok=True)
        os.chmod(self.dir / "homes", 0o755)
        for rel, (text, mode) in _seed_files().items():
            path = self.dir / "seed" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            os.chmod(path, mode)
        from . import chrome, mime_defaults, vm_windows  # here: the top imports stay stdlib-only

        chrome.write_seed(
            self.dir / "seed", self.browser_flags
        )  # google-chrome as Chromium (chrome.py)
        mime_defaults.write_seed(self.dir / "seed")  # Ubuntu's default apps (mime_defaults.py)
        vm_windows.write_seed(self.dir / "seed")  # the VM's window classes (vm_windows.py)

    def start(
        self, x_socket: str | None, ipc_ns: int | None = None, mqueue: int | None = None
    ) -> float:
        """Start a clean sandbox (and a spare in the background); returns the seconds it took
        (~0.07 s). ``x_socket``: the X server's socket file, bound into ``/tmp/.X11-unix``.
        ``ipc_ns``: an open file descriptor of the ipc namespace every sandbox of this start
        joins (the X server's, so that MIT-SHM works and the X server sees no host segment;
        it is duplicated, the caller keeps its own); ``None``: each sandbox gets its own.
        ``mqueue``: with ``ipc_ns``, an open directory of that namespace's ``mqueue`` file
        system (duplicated too), emptied on every reset as the sandbox's own would be.
        Raises :class:`SandboxError` with the setup's own error when it fails."""
        t0 = time.perf_counter()
        # dup'ed before stop() closes ours (a revert restarting passes them back)
        ipc_fd = os.dup(ipc_ns) if ipc_ns is not None else None
        mqueue_fd = os.dup(mqueue) if ipc_ns is not None and mqueue is not None else None
        self.stop()
        self._x_socket = x_socket
        self._ipc_fd, self._mqueue_fd = ipc_fd, mqueue_fd
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="legato-sandbox")
        self._active = self._worker.submit(self._launch, self.dir / "layers-0", x_socket).result()
        self._starting.discard(self._active.anchor.pid)
        self._connect(self._active)
        self._spare_layers = self.dir / "layers-1"
        self._start_spare()
        return time.perf_counter() - t0

    def stop(self) -> None:
        """Kill every process of the sandbox and of its spare."""
        if self._active is not None:
            self._note_dying(self._active)
            self._active = None
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                self._note_dying(spare.result())
            except Exception:  # a spare that failed to start has nothing to stop
                pass
        self._starting.clear()
        for fd in (self._ipc_fd, self._mqueue_fd):
            if fd is not None:
                os.close(fd)
        self._ipc_fd = self._mqueue_fd = None

    def close(self) -> None:
        """Stop everything and the worker thread."""
        self.stop()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        with self._dying_lock:
            dying, self._dying = self._dying, []
        for _, fd in dying:
            os.close(fd)

    def _note_dying(self, instance: _Instance) -> None:
        """Stop ``instance``; while its init is still ending it stays the sandbox's
        (:meth:`anchor_pids`). Drops the inits that ended since the last call."""
        init_fd = instance.stop()
        with self._dying_lock:
            ended = [(pid, fd) for pid, fd in self._dying if _exited(fd)]
            self._dying = [entry for entry in self._dying if entry not in ended]
            if init_fd is not None:
                self._dying.append((instance.init_pid, init_fd))
        for _, fd in ended:
            os.close(fd)

    def revert(self) -> dict[str, float]:
        """Drop the running sandbox (all its processes die) and switch to a clean one: the
        spare when there is one, else a new start. HOME is the session's to restore.
        Returns ``{revert_s}``. Raises :class:`SandboxError` when no clean sandbox starts."""
        t0 = time.perf_counter()
        old = self._active
        if old is not None:  # the running one until it is stopped, then a dying one
            self._note_dying(old)
        self._active = None
        self._clear_shared_ipc()  # the shared namespace outlives the sandbox
        spare, self._spare = self._spare, None
        try:
            if spare is None:
                raise SandboxError("no spare")
            self._active = spare.result()
            self._starting.discard(self._active.anchor.pid)
        except Exception:
            return {"revert_s": self.start(self._x_socket, self._ipc_fd, self._mqueue_fd)}
        self._connect(self._active)
        if old is not None:
            self._spare_layers = old.layers
        self._start_spare()
        return {"revert_s": time.perf_counter() - t0}

    def alive(self) -> bool:
        return self._active is not None and self._active.anchor.poll() is None

    def settle(self) -> None:
        """Wait until the spare is started (its layers, the dropped sandbox's, are emptied)."""
        if self._spare is not None:
            self._spare.exception()

    # -- what the session needs ------------------------------------------------------------------

    def process_table(self) -> dict[int, ProcInfo]:
        """:func:`.procs.own_process_table`, read while no sandbox is being forked: every
        sandbox process in it is then one :meth:`anchor_pids` knows (a spare starts in the
        background; its first process, seen before its pid was noted, looked like a task
        process and made a fresh desktop's first reset a real one)."""
        from .procs import own_process_table

        with self._spawning:
            return own_process_table()

    def anchor_pids(self, table: dict[int, ProcInfo] | None = None) -> set[int]:
        """The sandboxes' own processes on the host (unshare, init, init's sleep; the spare's,
        and while it starts everything below its ``unshare``). ``table``: the process table
        the caller judges (:meth:`process_table`); a spare's set-up commands seen there count
        as the sandbox's even when the spare is ready by the time this looks."""
        from .procs import descendants

        # each read once (a revert on another thread replaces them); the sandboxes starting
        # first: one that is done by the time the spare is looked at is in both
        starting = set(self._starting)
        active, spare = self._active, self._spare
        pids = active.pids() if active is not None else set()
        if spare is not None and spare.done() and spare.exception() is None:
            pids |= spare.result().pids()
        with self._dying_lock:  # stopped sandboxes' inits still ending (and what they hold)
            dying = [pid for pid, fd in self._dying if not _exited(fd)]
        # until start() or revert() makes it the running one, a sandbox's unshare stays here
        for pid in [*starting, *dying]:
            pids |= {pid, *(_tree(pid) if table is None else descendants(pid, table))}
        return pids

    def enter_argv(self, *, uid: int = SANDBOX_UID, cwd: str = SANDBOX_HOME) -> list[str]:
        """The argv prefix that runs a command inside the sandbox as ``uid``, in ``cwd``.

        Raises :class:`SandboxError` when the sandbox is not running.
        """
        if self._active is None:
            raise SandboxError("the desktop's sandbox is not running")
        from . import enter

        net = not self.network
        argv = enter.enter_argv(
            HOST_PYTHON, self._active.init_pid, CAPS_DROPPED, net, uid, uid, cwd
        )
        return self.limits.join_argv(argv) if self.limits is not None else argv

    def dirty(self) -> list[str]:
        """What the task left that only a revert undoes (:func:`.leftovers.written`: the
        overlays' upper layers, the sandbox's own tmpfs directories, System V IPC objects),
        as paths inside (``etc/x``, ``root/.bashrc``, ``ipc/sem``...); empty when clean.
        Call it once the task's processes are dead."""
        from . import leftovers  # here: this module alone must run as a script (see the tests)

        if self._active is None:
            return []
        uppers = [self._active.layers / "upper" / name for name in OVERLAID]
        root = Path(f"/proc/{self._active.init_pid}/root")
        found = leftovers.written(root, [u for u in uppers if u.is_dir()])
        found += leftovers.changed(root, self._active.attrs)
        # in the X server's namespace a segment of a killed app lives until the X server has
        # seen its client go (then kernel.shm_rmid_forced ends it): only the other kinds count
        kinds = ("sem", "msg") if self._ipc_fd is not None else leftovers.IPC_KINDS
        return found + leftovers.ipc_objects(f"/proc/{self._active.init_pid}/ns/ipc", kinds)

    def clean_homes(self) -> None:
        """``/home`` back to what the setup bound (``homes/``: 0755, root's, nothing but
        ``user``): root inside may have added entries or changed its mode. HOME itself is the
        session's to restore (:func:`.home.restore`). Nothing is followed."""
        from . import leftovers

        fd = os.open(self.dir / "homes", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, 0, 0)
            os.fchmod(fd, 0o755)
            leftovers.empty_fd(fd, keep=(SANDBOX_USER,))
        finally:
            os.close(fd)

    def clear_shared(self) -> None:
        """Empty the running sandbox's ``/dev/shm``, ``/dev/mqueue`` and ``/run`` (but the
        session's ``/run/user/1000``); its processes must be dead (:func:`.leftovers.clear`)."""
        from . import leftovers

        if self._active is not None:
            leftovers.clear(Path(f"/proc/{self._active.init_pid}/root"), SANDBOX_UID)
        if self._mqueue_fd is not None:
            leftovers.empty_fd(self._mqueue_fd)

    def _clear_shared_ipc(self) -> None:
        """Empty the shared ipc namespace (none: nothing to do) of what only a revert undid
        when it was the sandbox's own: System V semaphores and message queues (segments die
        with their last attach), POSIX message queues."""
        from . import leftovers

        if self._ipc_fd is not None:
            leftovers.clear_ipc(self._ipc_path(), ("sem", "msg"))
        if self._mqueue_fd is not None:
            leftovers.empty_fd(self._mqueue_fd)

    def describe(self) -> dict:
        """For ``/legato/health``: the sandbox's user, HOME, network and init pid."""
        return {
            "user": SANDBOX_USER,
            "home": SANDBOX_HOME,
            "network": "host" if self.network else "own" if self.forward else "none",
            "forward": {str(k): v for k, v in self.forward.items()},
            "init_pid": self.init_pid,
            "spare": self._spare is not None,
        }

    # -- internals -------------------------------------------------------------------------------

    def _ipc_path(self) -> str:
        """The shared ipc namespace as a path (our process's own descriptor of it)."""
        return f"/proc/{os.getpid()}/fd/{self._ipc_fd}"

    def _connect(self, instance: _Instance) -> None:
        """Start ``pasta`` for ``instance``'s network namespace (with :attr:`forward`), on the
        worker thread (its parent-death signal), and wait until it listens on every host port.
        Raises :class:`SandboxError` with pasta's message when it exits or does not listen
        within :data:`START_TIMEOUT_S` (e.g. a host port taken by another program)."""
        if not self.forward or self._worker is None:
            return
        instance.pasta = self._worker.submit(self._pasta, instance.init_pid).result()
        self._starting.discard(instance.pasta.pid)  # the instance's own from now on
        ports = set(self.forward.values())
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ports <= _listening(instance.pasta.pid):
            if instance.pasta.poll() is not None:
                err = instance.pasta.stderr.read().decode(errors="replace").strip()[-500:]
                instance.stop_pasta()
                raise SandboxError(f"pasta exited: {err or 'no message'}")
            if time.monotonic() > deadline:
                instance.stop_pasta()
                raise SandboxError(f"pasta did not listen on host ports {sorted(ports)} in 10 s")
            time.sleep(0.001)

    def _pasta(self, init_pid: int) -> subprocess.Popen:
        argv = [PASTA, "--foreground", "--quiet", "--runas", "0", "--config-net"]
        for inside, host in sorted(self.forward.items()):
            argv += ["-t", f"127.0.0.1/{host}:{inside}"]
        # no UDP forwards, and nothing inside reaches the host's own loopback services: no
        # forwards from inside to the host (-T/-U none) and no gateway mapped onto the host's
        # 127.0.0.1 / ::1 (pasta's default turns a connection to the gateway address into one
        # to the host's loopback: a red team reached Dagster's webserver that way)
        argv += ["-u", "none", "-T", "none", "-U", "none", "--no-map-gw", str(init_pid)]
        with self._spawning:  # the sandbox's from its first moment (anchor_pids)
            proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self._starting.add(proc.pid)
        return proc

    def _start_spare(self) -> None:
        if self.keep_spare and self._worker is not None:
            self._spare = self._worker.submit(self._launch, self._spare_layers, self._x_socket)

    def _launch(self, layers: Path, x_socket: str | None) -> _Instance:
        """Empty ``layers`` and start namespaces on it (runs on the worker thread)."""
        layers.mkdir(exist_ok=True)
        os.chmod(layers, 0o700)
        for kind in ("upper", "work", "tmp", "run"):
            top = layers / kind
            if os.path.lexists(top):
                shutil.rmtree(top)  # fd-based on Linux: follows no symlink the task left
        for kind in ("upper", "work"):
            for name in OVERLAID:
                (layers / kind / name).mkdir(parents=True)
        _fresh_dirs(layers, x_socket)
        (layers / "root").mkdir(exist_ok=True)
        from . import chrome, enter

        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "SB": str(self.dir),
            "LAYERS": str(layers),
            "OVERLAID": " ".join(OVERLAID),
            "UID_IN": str(SANDBOX_UID),
            "X_SOCKET": x_socket or "",
            "OWN_NET": "0" if self.network else "1",
            "OWN_IPC": "1" if self._ipc_fd is None else "0",
            "TMPFS_SIZE": self.tmpfs_size,
            "SMALL_TMPFS": SMALL_TMPFS,
            "PROC_READONLY": " ".join(PROC_READONLY),
            "PROC_MASKED": " ".join(PROC_MASKED),
            "SYS_MASKED": " ".join(SYS_MASKED),
            "INIT_ARGV": shlex.join(enter.init_argv(HOST_PYTHON, CAPS_DROPPED)),
            # host file -> mount point in the seed layer ("src:dst" words; chrome.py)
            "BINDS": " ".join(f"{src}:{dst}" for src, dst in chrome.bind_mounts(self.dir / "seed")),
        }
        argv = ["setpriv", "--pdeathsig", "KILL", "--"]
        if self._ipc_fd is not None:  # join the shared ipc namespace (as host root, first)
            argv += ["nsenter", f"--ipc=/proc/self/fd/{self._ipc_fd}", "--"]
        argv += ["unshare", "--user", "--mount", "--pid"]
        argv += [] if self._ipc_fd is not None else ["--ipc"]
        argv += ["--fork", "--kill-child", "--propagation", "private"]
        if not self.network:
            argv.append("--net")
        argv += ["--", "sh", "-c", SETUP_SCRIPT]
        if self.limits is not None:  # the init and all below it in the desktop's cgroup
            argv = self.limits.join_argv(argv)
        with self._spawning:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
                pass_fds=() if self._ipc_fd is None else (self._ipc_fd,),
            )
            self._starting.add(proc.pid)
        try:
            _write_id_maps(proc)
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            _wait_ready(proc)
            instance = _Instance(layers, proc, *_wait_init(proc))
            from . import leftovers

            watched = [*leftovers.WATCHED, *OVERLAID]
            if x_socket:
                watched.append(f"tmp/.X11-unix/{os.path.basename(x_socket)}")
            root = Path(f"/proc/{instance.init_pid}/root")
            instance.attrs = leftovers.attributes(root, watched)
            return instance
        except BaseException:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            self._starting.discard(proc.pid)  # once it is gone
            raise


def _fresh_dirs(layers: Path, x_socket: str | None) -> None:
    """The sandbox's own ``/tmp`` and ``/run/user/1000`` (``layers/tmp``, ``layers/run``), made
    new for every sandbox and never shared with another: the setup (root, on the host's
    filesystem) then works in directories no task has ever written, and a task can plant no
    link there for it (or for the next sandbox) to follow. ``tmp/.X11-unix/X<n>`` is the X
    socket's mount point."""
    tmp = layers / "tmp"
    tmp.mkdir(mode=0o700)
    os.chmod(tmp, 0o1777)
    run = layers / "run"
    run.mkdir(mode=0o700)
    os.chown(run, SANDBOX_UID, SANDBOX_UID)
    if x_socket:
        (tmp / ".X11-unix").mkdir(mode=0o700)
        os.chmod(tmp / ".X11-unix", 0o1777)
        fd = os.open(
            tmp / ".X11-unix" / os.path.basename(x_socket),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
            0o644,
        )
        os.close(fd)


def _write_id_maps(proc: subprocess.Popen) -> None:
    mine = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/user") != mine:
                break
        except OSError:
            pass
        if proc.poll() is not None:
            raise SandboxError(f"unshare failed: {_stderr(proc)}")
        if time.monotonic() > deadline:
            raise SandboxError("unshare did not create the user namespace within 10 s")
        time.sleep(0.0005)
    try:
        Path(f"/proc/{proc.pid}/uid_map").write_text(ID_MAP)
        Path(f"/proc/{proc.pid}/gid_map").write_text(ID_MAP)
    except OSError as exc:
        raise SandboxError(
            f"cannot write the sandbox's uid/gid maps ({exc.strerror}): the desktop server"
            " must run as root with user namespaces enabled"
        ) from None


def _wait_ready(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise SandboxError(f"the sandbox did not start: {_stderr(proc) or 'timed out'}")


def _wait_init(proc: subprocess.Popen) -> tuple[int, int]:
    """Host pids of the sandbox's init (``tini``, ``unshare``'s child) and of its one child
    (``sleep infinity``), read as soon as they exist: nothing else runs in the namespaces yet,
    so the first child of the init is the sleep whatever it is called. Raises
    :class:`SandboxError` when they do not appear within :data:`START_TIMEOUT_S`."""
    deadline = time.monotonic() + START_TIMEOUT_S
    init = None
    while time.monotonic() < deadline:
        if init is None:
            children = _children(proc.pid)
            if children and _comm(children[0]) == "tini":
                init = children[0]
        if init is not None:
            children = _children(init)
            if children:
                return init, children[0]
        if proc.poll() is not None:
            raise SandboxError(f"the sandbox exited at start: {_stderr(proc)}")
        time.sleep(0.0005)
    raise SandboxError("the sandbox's init did not start within 10 s")


def _listening(pid: int) -> set[int]:
    """TCP ports ``pid`` listens on (IPv4) in our network namespace (``/proc/self/net/tcp``,
    state ``0A``, sockets among ``pid``'s open files)."""
    try:
        lines = Path("/proc/self/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return set()
    inodes = _socket_inodes(pid)
    ports = set()
    for line in lines:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                found.add(link[8:-1])
    except OSError:
        pass
    return found


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _exited(pidfd: int) -> bool:
    """:func:`.procs.pidfd_exited` (imported here: the module itself is stdlib only)."""
    from .procs import pidfd_exited

    return pidfd_exited(pidfd)


def _tree(pid: int) -> set[int]:
    """Every descendant of ``pid`` (through ``/proc/PID/task/PID/children``)."""
    found: set[int] = set()
    stack = _children(pid)
    while stack:
        child = stack.pop()
        if child not in found:
            found.add(child)
            stack += _children(child)
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _stderr(proc: subprocess.Popen) -> str:
    if proc.stderr is None:
        return ""
    try:
        if proc.poll() is None:
            return ""
        return proc.stderr.read().decode(errors="replace").strip()[-500:]
    except (OSError, ValueError):
        return ""
