"""Scratch directories in the temp folder that a killed process does not leak for good.

legato makes its working directories under the temp folder (``$TMPDIR``, else ``/tmp``): a
desktop server's state (``legato-desktop-*``, ~0.5 MB: the sandbox layers, the baseline
HOME), an OSWorld grader's work directory (``legato-<desktop>-osworld-*``), the graders'
template's (``legato-osworld-template-*``). Each is removed when its owner ends normally or
on SIGTERM/SIGINT; a process killed with SIGKILL (the OOM killer, ``kill -9``) or SIGQUIT
cannot, and its directories stayed behind forever.

So every such directory is made by :func:`scratch_dir`, which writes its owner's pid and
start time (``/proc/<pid>/stat`` field 22, clock ticks since boot: a pid reused by another
process does not match), the boot's id and the pid namespace's into :data:`OWNER_FILE`;
:func:`sweep`, run when a batch's first desktops open (``desktops.open_desktops``) and when
``legato desktop serve`` starts, removes the ``legato-*`` directories whose owner no longer
runs. It leaves alone a directory of a live process (a batch running beside this one), one
whose owner ran on another boot or in another pid namespace (a container sharing the temp
folder), one with no owner file (another program's, or made before this module), one owned
by another user, a link, and one with a mount point below it.

Standard library only: the early start (``desktops/early.py``) imports it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile

log = logging.getLogger(__name__)

OWNER_FILE = ".legato-owner"
PREFIX = "legato-"


def scratch_dir(prefix: str) -> str:
    """A new directory ``<tempdir>/<prefix>XXXXXXXX`` (``tempfile.mkdtemp``: mode 0700),
    with this process recorded as its owner for :func:`sweep`. ``prefix`` must start with
    ``legato-`` (``ValueError`` otherwise). Raises ``OSError`` as ``mkdtemp`` does."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"scratch_dir: prefix {prefix!r} must start with {PREFIX!r}")
    path = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        f.write(" ".join(str(v) for v in _identity(os.getpid())) + "\n")
    return path


def sweep(root: str | None = None) -> list[str]:
    """Remove the ``legato-*`` directories under ``root`` (default: the temp folder) whose
    owner (:data:`OWNER_FILE`) has ended; returns their paths. An owner is judged only when
    it ran on this boot and in this pid namespace (``/proc/sys/kernel/random/boot_id``,
    ``/proc/self/ns/pid``): two containers sharing a temp folder, or a temp folder that
    outlived a reboot, cannot tell each other's processes, so those directories are left.
    Never raises: a directory it cannot read, judge or remove is skipped (logged at debug
    level)."""
    root = root or tempfile.gettempdir()
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(PREFIX)]
        here = _identity(os.getpid())
    except OSError as exc:
        log.debug("sweep: cannot list %s: %s", root, exc)
        return []
    mounts: list[str] | None = None
    removed = []
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            owner = _owner(entry.path)
            if owner is None or owner[2:] != here[2:] or _running(*owner[:2]):
                continue
            if mounts is None:
                mounts = _mount_points()
            real = os.path.realpath(entry.path)
            if any(m == real or m.startswith(real + "/") for m in mounts) or _crosses(real):
                log.debug("sweep: %s has a mount point below it; left", entry.path)
                continue
            _remove(entry.path)
            removed.append(entry.path)
        except Exception as exc:  # noqa: BLE001 - one bad directory never stops a batch
            log.debug("sweep: %s skipped: %s", entry.path, exc)
    if removed:
        log.info("removed %d directories left by ended legato processes", len(removed))
    return removed


def _identity(pid: int) -> tuple[int, int, str, int]:
    """(pid, its start time in clock ticks since boot, the boot's id, the pid namespace's
    inode). Raises ``OSError`` when there is no such process."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return pid, _start_time(pid), boot, os.stat("/proc/self/ns/pid").st_ino


def _owner(path: str) -> tuple[int, int, str, int] | None:
    """The owner file's fields, or ``None`` when it is missing, not a regular file (a link, a
    FIFO: never followed nor waited on) or not one of ours."""
    try:
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        pid, start, boot, ns = os.read(fd, 200).decode().split()
        return int(pid), int(start), boot, int(ns)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _running(pid: int, start: int) -> bool:
    """Whether ``pid`` runs and started at ``start`` (clock ticks since boot)."""
    try:
        return _start_time(pid) == start
    except OSError:
        return False


def _start_time(pid: int) -> int:
    """``/proc/<pid>/stat`` field 22. Raises ``OSError`` when there is no such process."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _mount_points() -> list[str]:
    """Every mount point of this mount namespace (``/proc/self/mountinfo`` field 5, its
    ``\\ooo`` escapes undone on the bytes)."""
    with open("/proc/self/mountinfo", "rb") as f:
        lines = f.read().splitlines()
    unescape = re.compile(rb"\\([0-7]{3})")
    return [
        os.fsdecode(unescape.sub(lambda m: bytes([int(m.group(1), 8)]), line.split(b" ")[4]))
        for line in lines
        if line.count(b" ") > 4
    ]


def _crosses(path: str) -> bool:
    """Whether a directory below ``path`` is on another filesystem (a mount the mount table
    did not show, e.g. in another namespace's view)."""
    device = os.lstat(path).st_dev
    for top, dirs, _ in os.walk(path):
        for name in dirs:
            if os.lstat(os.path.join(top, name)).st_dev != device:
                return True
    return False


def _remove(path: str) -> None:
    """Remove ``path``'s contents, then its owner file, then itself: a removal cut short
    leaves the owner file, and the next sweep finishes it."""
    for entry in os.scandir(path):
        if entry.name == OWNER_FILE:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    os.unlink(os.path.join(path, OWNER_FILE))
    os.rmdir(path)
