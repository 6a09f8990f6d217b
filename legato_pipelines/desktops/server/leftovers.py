"""What a task leaves in its sandbox outside HOME and ``/tmp``: found, or cleared in place.

A fast reset must leave nothing of one attempt for the next. HOME and ``/tmp`` are restored
by the session; this module covers the rest of the sandbox's writable places, each either

- **cleared in place** (every fast reset; apps and ``sudo`` use them all the time, so
  writing there must not force a revert): ``/dev/shm`` and ``/dev/mqueue`` (POSIX shared
  memory and message queues), ``/run`` (sudo's timestamps, daemons' pid files) but for
  ``/run/user/1000``, a host directory the session empties like ``/tmp``; or
- **reported** (:func:`written`), so that the reset reverts the whole sandbox (rare, and
  only root inside can write there): the overlays' upper layers (``/etc /usr /var /opt``),
  the sandbox's own tmpfs root and its ``/root``, ``/mnt``, ``/media``, ``/srv``, new
  entries in ``/dev``, and System V semaphores and message queues left in the sandbox's ipc
  namespace (:func:`ipc_objects`; shared memory segments die with their last attach, as
  ``kernel.shm_rmid_forced`` is on). A sandboxed desktop's ipc namespace is its X server's,
  which outlives the sandbox: a revert empties it (:func:`clear_ipc`).

Mounts made inside need no check: no process in the sandbox holds ``CAP_SYS_ADMIN``
(:data:`.sandbox.CAPS_DROPPED`), so none can mount. Paths are read through ``/proc/<init>/root`` (the
sandbox's root as the host reaches it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import threading
from pathlib import Path

#: Entries of the sandbox's tmpfs root that the setup makes (plus the overlaid directories
#: and the host's ``/bin``-style symlinks, added by the caller).
ROOT_ENTRIES = frozenset(
    {"proc", "sys", "dev", "tmp", "home", "root", "run", "mnt", "media", "srv"}
    | {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}
)
#: Entries of ``/dev`` that the setup makes.
DEV_ENTRIES = frozenset(
    {"null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "mqueue", "ptmx"}
    | {"fd", "stdin", "stdout", "stderr"}
)
#: Directories that must stay empty.
EMPTY_DIRS = ("root", "mnt", "media", "srv")
CLONE_NEWIPC = 0x08000000
IPC_RMID = 0
#: System V object kinds, as ``/proc/sysvipc`` names them.
IPC_KINDS = ("sem", "msg", "shm")


def written(root: Path, uppers: list[Path]) -> list[str]:
    """What the task wrote that only a revert undoes, as paths inside the sandbox without
    the leading slash (``etc/x``, ``root/.bashrc``, ``ipc/sem``...); empty when nothing.

    ``root``: the sandbox's root as the host reaches it; ``uppers``: the overlays' upper
    directories (named as the directory they overlay).
    No symlink inside is followed (one would resolve against the host's root): an expected
    directory replaced by anything else is reported itself.
    """
    found: list[str] = []
    for upper in uppers:
        found += [f"{upper.name}/{entry}" for entry in sorted(os.listdir(upper))]
    top = ROOT_ENTRIES | {upper.name for upper in uppers}
    checks = [((), top), (("dev",), DEV_ENTRIES)] + [((name,), set()) for name in EMPTY_DIRS]
    for parts, expected in checks:
        try:
            entries = _entries(root, parts)
        except OSError:
            found.append("/".join(parts))
            continue
        found += ["/".join((*parts, e)) for e in entries if e not in expected]
    return found


#: Places whose type, mode, owner and inode a task must not change (paths inside, no leading
#: slash; the overlaid directories, and the X socket's mount point, are added by the caller):
#: a change survives no fast reset (``chmod 0700 /usr`` lives in the overlay root's upper
#: directory, which lists empty; ``/run/user`` replaced by a link would be followed), so
#: :func:`changed` reports it and the reset reverts. (``/home`` is bound from a directory every
#: sandbox shares: the session puts it back on every reset, :meth:`.Sandbox.clean_homes`.)
WATCHED = (
    "",
    "tmp",
    "tmp/.X11-unix",
    "root",
    "run",
    "run/user",
    "run/user/1000",
    "dev",
    "dev/shm",
    "dev/mqueue",
    "dev/pts",
    "mnt",
    "media",
    "srv",
)

Attributes = tuple[int, int, int, int, int] | None


def attributes(root: Path, paths: list[str]) -> dict[str, Attributes]:
    """``(mode with type, uid, gid, dev, inode)`` of each path inside the sandbox whose root
    is ``root``, no component followed when a link (``None``: missing, or reached only
    through a link)."""
    found: dict[str, Attributes] = {}
    for path in paths:
        parts = tuple(p for p in path.split("/") if p)
        try:
            fd = _open_dir(root, parts[:-1])
        except OSError:
            found[path] = None
            continue
        try:
            st = os.stat(parts[-1] if parts else ".", dir_fd=fd, follow_symlinks=False)
            found[path] = (st.st_mode, st.st_uid, st.st_gid, st.st_dev, st.st_ino)
        except OSError:
            found[path] = None
        finally:
            os.close(fd)
    return found


def changed(root: Path, expected: dict[str, Attributes]) -> list[str]:
    """The paths of ``expected`` (:func:`attributes` at the sandbox's start) whose type, mode,
    owner or inode changed since, as ``attributes of PATH`` (``/`` for the root)."""
    now = attributes(root, list(expected))
    return [f"attributes of /{path}" for path, attrs in expected.items() if now[path] != attrs]


def ipc_objects(ns: str, kinds: tuple[str, ...] = IPC_KINDS) -> list[str]:
    """System V IPC objects alive in the ipc namespace ``ns`` (a namespace file:
    ``/proc/<pid>/ns/ipc``, or ``/proc/self/fd/<n>`` of an open one), as ``ipc/sem``,
    ``ipc/msg``, ``ipc/shm`` once each of ``kinds`` when any exists. Read by a short-lived
    thread that joins that namespace (``/proc/sysvipc`` shows the reader's); ``[]`` when it
    cannot."""
    found: list[str] = []

    def read() -> None:
        for kind in kinds:
            if _ipc_ids(kind):
                found.append(f"ipc/{kind}")

    _in_ipc_ns(ns, read)
    return found


def clear_ipc(ns: str, kinds: tuple[str, ...] = IPC_KINDS) -> None:
    """Remove every System V object of ``kinds`` in the ipc namespace ``ns`` (as
    :func:`ipc_objects` names it), as ``ipcrm --all`` does (``IPC_RMID``: a segment still
    attached goes with its last detach). For a namespace that outlives the sandbox (the
    desktop's, shared with its X server): dropping the sandbox no longer drops its objects."""

    def remove() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for kind in kinds:
            for ipc_id in _ipc_ids(kind):
                if kind == "sem":
                    libc.semctl(ipc_id, 0, IPC_RMID)
                elif kind == "msg":
                    libc.msgctl(ipc_id, IPC_RMID, None)
                else:
                    libc.shmctl(ipc_id, IPC_RMID, None)

    _in_ipc_ns(ns, remove)


def _ipc_ids(kind: str) -> list[int]:
    """Ids of the System V objects of ``kind`` (``sem``, ``msg``, ``shm``) in the caller's
    ipc namespace (``/proc/sysvipc/<kind>``: a header, then one line an object, id second)."""
    try:
        with open(f"/proc/sysvipc/{kind}") as f:
            return [int(line.split()[1]) for line in f.readlines()[1:] if line.strip()]
    except (OSError, ValueError, IndexError):
        return []


def _in_ipc_ns(ns: str, fn) -> None:
    """Run ``fn()`` in a short-lived thread that joins the ipc namespace ``ns`` first (a
    thread may change its own ipc namespace; the server's other threads stay where they are).
    Does nothing when the namespace cannot be opened or joined."""

    def run() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(ns, os.O_RDONLY)
        except OSError:
            return
        try:
            if libc.setns(fd, CLONE_NEWIPC) != 0:
                return
        finally:
            os.close(fd)
        fn()

    thread = threading.Thread(target=run, name="legato-ipc")
    thread.start()
    thread.join()


def clear(root: Path, uid: int) -> None:
    """Empty ``/dev/shm``, ``/dev/mqueue`` and ``/run`` but ``/run/user/<uid>`` of the
    sandbox whose root is ``root`` (the task's processes must be dead: nothing may write
    meanwhile). A missing directory is skipped; nothing is followed (:func:`empty_fd`)."""
    for parts, keep in (
        (("dev", "shm"), ()),
        (("dev", "mqueue"), ()),
        (("run",), ("user",)),
        (("run", "user"), (str(uid),)),
    ):
        try:
            fd = _open_dir(root, parts)
        except OSError:
            continue
        try:
            empty_fd(fd, keep)
        finally:
            os.close(fd)


def empty_dir(path: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove everything in the host directory ``path`` but the names in ``keep``. ``path``
    itself is not followed when it is a symlink (the sandbox's root may have made it one, to
    a host directory): a symlink or a file there is removed instead. Missing: no-op."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(path)
        return
    try:
        empty_fd(fd, keep)
    finally:
        os.close(fd)


def empty_fd(fd: int, keep: tuple[str, ...] = ()) -> None:
    """Remove every entry of the directory open as ``fd`` but ``keep``: symlinks as links,
    directories with ``shutil.rmtree`` relative to ``fd`` (which follows no symlink)."""
    for name in os.listdir(fd):
        if name in keep:
            continue
        try:
            if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass


def _open_dir(root: Path, parts: tuple[str, ...]) -> int:
    """An fd of ``root/parts...``, each part opened without following a symlink.
    Raises ``OSError`` when a part is missing or not a directory."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _entries(root: Path, parts: tuple[str, ...]) -> list[str]:
    """Sorted names in ``root/parts...`` (see :func:`_open_dir`)."""
    fd = _open_dir(root, parts)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)
