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
  entries in ``/dev``, and System V semaphores, message queues and shared memory segments
  left in the sandbox's ipc namespace (segments die with their last process, as the setup
  sets ``kernel.shm_rmid_forced``; semaphores and queues would live on).

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


def ipc_objects(init_pid: int) -> list[str]:
    """System V IPC objects alive in ``init_pid``'s ipc namespace (``ipc/sem``,
    ``ipc/msg``, ``ipc/shm`` once each when any exists). Read by a short-lived thread that
    joins that namespace (``/proc/sysvipc`` shows the reader's); ``[]`` when it cannot."""
    found: list[str] = []

    def read() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(f"/proc/{init_pid}/ns/ipc", os.O_RDONLY)
        except OSError:
            return
        try:
            if libc.setns(fd, CLONE_NEWIPC) != 0:
                return
        finally:
            os.close(fd)
        for kind in ("sem", "msg", "shm"):
            try:
                with open(f"/proc/sysvipc/{kind}") as f:
                    if len(f.readlines()) > 1:  # a header line, then one line an object
                        found.append(f"ipc/{kind}")
            except OSError:
                pass

    thread = threading.Thread(target=read, name="legato-ipc-check")
    thread.start()
    thread.join()
    return found


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
