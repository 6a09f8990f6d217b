"""Scratch directories in the temp folder that a killed process does not leak for good.

legato makes its working directories under the temp folder (``$TMPDIR``, else ``/tmp``): a
desktop server's state (``legato-desktop-*``, ~0.5 MB: the sandbox layers, the baseline
HOME), an OSWorld grader's work directory (``legato-<desktop>-osworld-*``), the graders'
template's (``legato-osworld-template-*``). Each is removed when its owner ends normally or
on SIGTERM/SIGINT; a process killed with SIGKILL (the OOM killer, ``kill -9``) or SIGQUIT
cannot, and its directories stayed behind forever.

So every such directory is made by :func:`scratch_dir`, which writes its owner's pid and
start time (``/proc/<pid>/stat`` field 22, clock ticks since boot: a pid reused by another
process does not match) into :data:`OWNER_FILE`; :func:`sweep`, run when local desktops
open (``desktops/local/backend.py``, ``legato desktop serve``), removes the ``legato-*``
directories whose owner no longer runs. It leaves alone a directory of a live process (a
batch running beside this one), one with no owner file (another program's, or made before
this module), one owned by another user, and one with a mount point below it.

Standard library only: the early start (``desktops/early.py``) imports it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

log = logging.getLogger(__name__)

OWNER_FILE = ".legato-owner"
PREFIX = "legato-"


def scratch_dir(prefix: str) -> str:
    """A new directory ``<tempdir>/<prefix>XXXXXXXX`` (``tempfile.mkdtemp``: mode 0700),
    with this process recorded as its owner for :func:`sweep`. ``prefix`` must start with
    ``legato-``. Raises ``OSError`` as ``mkdtemp`` does."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"scratch_dir: prefix {prefix!r} must start with {PREFIX!r}")
    path = tempfile.mkdtemp(prefix=prefix)
    me = os.getpid()
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        f.write(f"{me} {_start_time(me)}\n")
    return path


def sweep(root: str | None = None) -> list[str]:
    """Remove the ``legato-*`` directories under ``root`` (default: the temp folder) whose
    owner (:data:`OWNER_FILE`) has ended; returns their paths. Never raises for a directory
    it cannot read or remove (it is skipped, logged at debug level)."""
    root = root or tempfile.gettempdir()
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(PREFIX)]
    except OSError as exc:
        log.debug("sweep: cannot list %s: %s", root, exc)
        return []
    uid = os.getuid()
    mounts: list[str] | None = None
    removed = []
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != uid:
                continue
            owner = _owner(entry.path)
        except OSError:
            continue
        if owner is None or _running(*owner):
            continue
        if mounts is None:
            mounts = _mount_points()
        if any(m == entry.path or m.startswith(entry.path + "/") for m in mounts):
            log.debug("sweep: %s has a mount point below it; left", entry.path)
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    if removed:
        log.info("removed %d directories left by ended legato processes", len(removed))
    return removed


def _owner(path: str) -> tuple[int, int] | None:
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            pid, start = f.read().split()
        return int(pid), int(start)
    except (OSError, ValueError):
        return None


def _running(pid: int, start: int) -> bool:
    """Whether ``pid`` runs and started at ``start`` (clock ticks since boot)."""
    try:
        return _start_time(pid) == start
    except OSError:
        return False


def _start_time(pid: int) -> int:
    """``/proc/<pid>/stat`` field 22. Raises ``OSError`` when there is no such process."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat.rsplit(")", 1)[1].split()[19])


def _mount_points() -> list[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    # field 5: the mount point, with spaces and the like octal-escaped ("\040")
    return [
        line.split()[4].encode().decode("unicode_escape") for line in lines if line.count(" ") > 4
    ]
