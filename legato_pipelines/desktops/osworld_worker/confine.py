"""Graders confined: an osworld worker that reads a desktop's data runs as nobody in particular.

OSWorld's getters and metrics run Python on what a desktop returns (``check_gnome_favorite_apps``
``eval``s the output of ``gsettings`` run on the desktop, which a policy with ``sudo`` inside
its sandbox can replace). So every worker that grades or sets up a desktop (the local
backend's graders, the ``osworld`` backend over local desktops) enters, before it reads
anything from a desktop:

- a **pid namespace** of its own, as its pid 1 (it sees no host or collector process in its
  ``/proc``; its own children die with it);
- a **mount namespace** whose root is a fresh tmpfs holding, read-only, ``/usr``, ``/etc``,
  ``/opt``, ``/sys``, the OSWorld interpreter's prefixes and the project's package (for the
  worker's own modules), five ``/dev`` nodes, its own ``/proc``, a ``/tmp`` and ``/dev/shm``
  tmpfs of its own, and, writable, only the paths it is given (its work directory: where
  DesktopEnv's getters write what they fetch). ``/root``, ``/home``, ``/run``, ``/var``, the
  run directories and other desktops' directories are not there;
- an **IPC and UTS namespace** of its own;
- the user :data:`GRADER_UID` / :data:`GRADER_GID` (not root, not the sandbox's
  uid 1000, outside the sandboxes' uid map ``0..65535``), no supplementary group, an empty
  capability bounding set and ``no_new_privs`` (a set-uid ``sudo`` gives nothing).

- and a **network namespace** of its own (``network`` ``own``, where ``pasta`` is installed)
  that the collector connects to its desktop's host loopback ports alone (the server's,
  Chromium's CDP bridge, VLC's: ``channel.WorkerProcess.forward``); no route out.

Its environment is the collector's :func:`..child_env.worker_env` (no credential, no policy
key), with ``HOME`` in its own ``/tmp`` (docs/sandbox.md §6).

This module runs in two interpreters: the collector imports it for :func:`prepare_dir` and
:func:`hand_over` (the host side: which host paths the grader user may write), and the
worker (under the OSWorld interpreter) loads it by path for :func:`enter` and the pid
namespace (standard library and ``ctypes`` only; Linux, x86_64 or aarch64; needs root).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import sys

#: The grader user and group: no account of the host's (``/etc/passwd`` need not name them),
#: outside the sandboxes' identity map (``0 0 65536``), so no sandbox process is ever them.
GRADER_UID = 65537
GRADER_GID = 65537
GRADER_USER = "legato-grader"

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

#: Host directories bound read-only at their own paths (those that exist); ``/bin``, ``/lib``,
#: ``/lib64``, ``/sbin`` follow as links where the host has them as links (merged /usr).
READ_ONLY = ("/usr", "/etc", "/opt", "/sys")
TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEV_NODES = ("null", "zero", "full", "random", "urandom")
TMP_SIZE = "512m"  # the worker's own /tmp (and HOME): tmpfs, counted in its memory
SHM_SIZE = "64m"
NEW_ROOT = "/mnt"  # the mount point of the new root, in the worker's mount namespace only

_libc = ctypes.CDLL(None, use_errno=True)


class ConfineError(OSError):
    """A namespace, mount or credential step failed: the worker must not serve then."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise ConfineError(errno, f"confining the grader: {what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags: int, data=None) -> None:
    def enc(value):
        return None if value is None else os.fsencode(value)

    result = _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data))
    _check(result, f"mount {target} ({fstype or 'bind'})")


def unshare(flags: int) -> None:
    """``unshare(2)`` (Python 3.11 has no ``os.unshare``). Raises :class:`ConfineError`."""
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    """``setns(2)``. Raises :class:`ConfineError`."""
    _check(_libc.setns(fd, nstype), "setns")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


class PidNamespaces:
    """The next child of this (root) process is pid 1 of a new pid namespace: a template
    forking confined workers (op ``fork``). :meth:`before_fork` asks for a new namespace for
    the children; :meth:`after_fork` (in the parent) sets the children's namespace back to
    this process's own, so that the next :meth:`before_fork` can make another one (the kernel
    allows a new one only while the children's namespace is the process's own)."""

    def __init__(self):
        self._own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def before_fork(self) -> None:
        unshare(CLONE_NEWPID)

    def after_fork(self) -> None:
        setns(self._own, CLONE_NEWPID)


def spawned_in_pid_namespace(own_network: bool) -> None:
    """For a worker started by the collector (not forked): fork into a new pid namespace
    (and, with ``own_network``, a new network namespace, which the parent shares: the
    collector connects it by the pid it knows, the parent's). Returns in the child (pid 1
    there, which then calls :func:`enter` without ``own_network``); the parent stays outside,
    runs nothing of the desktop's, passes SIGTERM/SIGINT/SIGHUP on to the child and ends with
    its status (the collector's pipes are the child's alone). Raises :class:`ConfineError`."""
    unshare(CLONE_NEWPID | (CLONE_NEWNET if own_network else 0))
    pid = os.fork()
    if pid == 0:
        return
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + 9)


def host_pid() -> int:
    """This process's pid in the host's pid namespace, read from the host's ``/proc`` (call it
    before :func:`enter`, which replaces ``/proc``)."""
    return int(os.readlink("/proc/self"))


def interpreter_paths() -> list[str]:
    """What this interpreter imports from: its prefixes (venv and base) and ``sys.path``'s
    existing directories, plus the project's package (``legato_pipelines/``, whose modules
    the worker loads by path)."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, package]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    return [os.path.realpath(p) for p in paths]


def _inside(path: str, parents) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def _bind(source: str, target: str, *, writable: bool, devices: bool = False) -> None:
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(source, target, None, MS_BIND)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if devices else MS_NODEV)
    _mount(None, target, None, flags | (0 if writable else MS_RDONLY))


def enter(
    writable: list[str],
    *,
    uid: int = GRADER_UID,
    gid: int = GRADER_GID,
    own_network: bool = False,
) -> None:
    """Confine this process (root, pid 1 of a new pid namespace: :class:`PidNamespaces` or
    :func:`spawned_in_pid_namespace`) as the module docstring says: new mount, IPC and UTS
    namespaces, a new root with ``writable`` (absolute host paths, each bound at its own path)
    as the only writable host paths, a new ``/proc``, then user ``uid``/``gid`` with no
    capability and ``no_new_privs``. The working directory is kept (it must be one of
    ``writable``, below one, or below a read-only path). Open descriptors stay open (the
    protocol's socket or pipes, the log). ``own_network``: a new network namespace too (a
    loopback, down, until the collector connects it: ``channel.WorkerProcess.forward``). Raises :class:`ConfineError` when any step fails, or when a capability is
    left afterwards."""
    if os.getpid() != 1:
        raise ConfineError(0, "confining the grader: not pid 1 of a pid namespace of its own")
    cwd = os.getcwd()
    unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWNET if own_network else 0))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = NEW_ROOT
    if not os.path.isdir(new):
        raise ConfineError(0, f"confining the grader: no {new} to mount its new root on")
    _mount("legato-grader", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    for top in TOP_DIRS:
        if os.path.islink(top):
            os.symlink(os.readlink(top), new + top)
    tmp = new + "/tmp"
    os.makedirs(tmp)
    _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={TMP_SIZE}")
    done: list[str] = []
    for path in [*READ_ONLY, *interpreter_paths()]:
        if os.path.exists(path) and not _inside(path, done):
            _bind(path, new + path, writable=False)
            done.append(path)
    for path in writable:
        _bind(os.path.realpath(path), new + os.path.realpath(path), writable=True)
    for node in DEV_NODES:
        _bind(f"/dev/{node}", f"{new}/dev/{node}", writable=False, devices=True)
    os.makedirs(f"{new}/dev/shm")
    _mount("shm", f"{new}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={SHM_SIZE}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{new}/dev/{name}")
    for n, name in enumerate(("stdout", "stderr"), start=1):
        os.symlink(f"/proc/self/fd/{n}", f"{new}/dev/{name}")
    os.makedirs(f"{new}/proc")
    _mount("proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    home = f"{tmp}/home"
    os.makedirs(home, mode=0o700)
    os.chown(home, uid, gid)
    os.chdir(new)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise ConfineError(
            0, f"confining the grader: no pivot_root number for {platform.machine()}"
        )
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detaching the host's root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(cwd)  # as root: a directory the grader may not enter is kept all the same
    drop_privileges(uid, gid)
    os.environ.update(HOME="/tmp/home", TMPDIR="/tmp", USER=GRADER_USER, LOGNAME=GRADER_USER)


def drop_privileges(uid: int, gid: int) -> None:
    """``no_new_privs``, an empty bounding set, no supplementary group, then ``gid``/``uid`` as
    real, effective and saved ids (the kernel clears every capability on that change).
    Raises :class:`ConfineError` when a capability is left (``/proc/self/status``)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status") as f:
        caps = {
            k: v.strip() for k, _, v in (line.partition(":") for line in f) if k.startswith("Cap")
        }
    left = {k: v for k, v in caps.items() if int(v, 16)}
    if left or os.getuid() != uid or os.getgid() != gid:
        raise ConfineError(0, f"confining the grader: capabilities left {left}")


def prepare_dir(path, *, writable: bool, uid: int = GRADER_UID, gid: int = GRADER_GID) -> None:
    """Host side: let the grader user into directory ``path`` (the collector, root, made it):
    ``writable`` makes it the grader's (0700); otherwise root's with the grader's group, 0750
    (it may read and enter it, and create nothing in it, so it can replace nothing the
    collector later opens by name there)."""
    if writable:
        os.chown(path, uid, gid)
        os.chmod(path, 0o700)
    else:
        os.chown(path, 0, gid)
        os.chmod(path, 0o750)


def hand_over(path, *, uid: int = GRADER_UID, gid: int = GRADER_GID) -> None:
    """Host side: make the tree ``path`` (just written by the collector, nothing of the
    grader's in it yet) the grader user's, bottom up, links as links (``lchown``), so the
    grader writes into it only once the whole tree is handed over."""
    for top, dirs, files in os.walk(path, topdown=False):
        for name in dirs + files:
            os.chown(os.path.join(top, name), uid, gid, follow_symlinks=False)
    os.chown(path, uid, gid, follow_symlinks=False)
