"""Resource caps of one sandboxed desktop: a cgroup (pids, memory, CPU and IO weight) holding
every process of its sandbox, and a size-capped filesystem under its sandbox directory.

The kernel's own mechanisms, nothing home-made:

- **cgroup** ``legato-<desktop>``: ``pids`` (a fork bomb stops at the cap instead of filling
  the host's pid table), ``memory`` (the kernel's OOM killer kills inside the cgroup, not on
  the host), CPU weight and IO weight (a busy desktop gets one desktop's share, not all).
  cgroup v2 (``/sys/fs/cgroup/cgroup.controllers`` exists: most hosts) and cgroup v1 (one
  hierarchy per controller under ``/sys/fs/cgroup/<controller>``, with or without an empty
  ``unified`` cgroup2 mount beside them) behind :class:`Cgroup`. v2: ``pids.max``,
  ``memory.max`` (and ``memory.swap.max`` 0), ``cpu.weight``, ``io.weight``; a cap hit is
  read from ``pids.events`` (``max``) and ``memory.events`` (``oom_kill``). v1:
  ``pids.max``, ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``),
  ``cpu.shares`` (weight x 1024 / 100), ``blkio.bfq.weight`` or ``blkio.weight`` when the
  kernel has one (BFQ; without it there is no IO weight); hits from ``pids.events`` and
  ``memory.oom_control`` (``oom_kill``). v2 cgroups live under ``/sys/fs/cgroup/legato/``
  (the controllers are enabled in the root's and its ``cgroup.subtree_control``); v1 ones
  under the server's own cgroup of each hierarchy (``/proc/self/cgroup``).
- **disk**: the desktop's ``sandbox/`` directory (HOME, the overlays' upper layers, ``/tmp``,
  ``/run/user/1000``) is an ext4 filesystem in a sparse image file (``sandbox.img`` beside it,
  mounted through a loop device, ``-m 0``: root inside cannot go past the cap either), so a
  task that fills it gets ``ENOSPC`` and the host's disk keeps its space. The sandbox's tmpfs
  mounts (``/dev/shm``, ``/run``, ``/root``) are size-capped by :mod:`.sandbox` and their
  pages are charged to the memory cgroup.

Processes join the cgroup before they execute anything: :meth:`DesktopLimits.join_argv`
prefixes an argv with the host's ``/bin/sh`` writing its own pid into the cgroup's
``cgroup.procs`` and then ``exec``-ing the rest (``unshare`` of the sandbox, the entry (:mod:`.enter`) of
every process entered), so the sandbox's init and whatever is entered, and all their
children, are in it. The cgroup files cannot be written from inside: the sandbox sees ``/sys``
(and every cgroup mount below it) read-only and holds no ``sys_admin`` to remount it.

A cap counts as hit (:meth:`DesktopLimits.check`) when, since the last
:meth:`DesktopLimits.rebase` (every reset), the kernel refused a fork at ``pids.max`` or
OOM-killed a process of the cgroup, or when the disk has less than :func:`disk_margin` left.
A hit stays hit until the next rebase. Only v1 ran on the machine this was written on; the v2
path is tested against a fake cgroup tree (file names and values), not a real v2 kernel.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The caps' names, as a hit is reported (``DesktopError(kind="resource_limit")``'s message).
CAPS = ("pids", "memory", "disk")
#: The desktop server's error kind when a cap was hit (the record's ``error.type``).
RESOURCE_LIMIT = "resource_limit"
GIB = 1 << 30
#: The CPU cap's accounting period (µs): ``cpus`` x this much CPU time per period.
CPU_PERIOD_US = 100_000
MIB = 1 << 20

# The host's sh writes its pid into each cgroup.procs given before "--", then becomes argv.
JOIN_SCRIPT = 'for f; do shift; [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; exec "$@"'


class LimitsError(RuntimeError):
    """The caps cannot be set up here (no cgroup can be made, no loop device); the message
    names what to fix and the opt-out (desktop option ``limits=false``)."""


@dataclass(frozen=True, slots=True)
class Caps:
    """One desktop's caps. ``memory``, ``disk``: bytes; ``pids``: processes and threads;
    ``cpu_weight``, ``io_weight``: cgroup v2's scale (1..10000, 100 the kernel's default and
    every desktop's; v1's ``cpu.shares`` = weight x 10.24 and the ``blkio`` weight are
    derived); ``cpus``: CPU time the desktop's processes may use at most, in CPUs (v2
    ``cpu.max``, v1 ``cpu.cfs_quota_us`` per 100 ms; 0: no such cap), by default half the
    host's CPUs and at least one, so one desktop's fork bomb or memory hog leaves the rest of
    the machine to the X servers, desktop servers and other desktops (measured on 2 cores:
    the other desktops' steps 1.50x / 1.43x slower than idle without it, 0.78x / 0.93x with
    one CPU, in runs whose idle row differed; a CPU weight of 10 instead made them 0.99x / 1.00x
    but starved every desktop's own apps behind the host's other processes: reset -> ready of
    a terminal 3-4x slower on the loaded machine; BENCHMARKS.md, issue 30). Defaults sized
    for OSWorld's apps with room: a busy desktop (LibreOffice Calc and Writer, Chromium with
    tabs, GIMP, Thunderbird) held ~1.05 GiB PSS and ~250 tasks (docs/local-desktop.md §8)."""

    memory: int = 4 * GIB
    pids: int = 2048
    disk: int = 8 * GIB
    cpu_weight: int = 100
    io_weight: int = 100
    cpus: float = field(default_factory=lambda: max(1.0, (os.cpu_count() or 2) / 2))

    def to_json(self) -> dict[str, int]:
        return asdict(self)


#: ``--desktop-option limits=...`` keys and what each takes (errors name them).
CAP_KEYS = {
    "cpus": "CPUs the desktop may use at most, e.g. 1 or 1.5 (0: no such cap)",
    "memory": "bytes or a size such as 4g, 512m",
    "pids": "a number of processes",
    "disk": "bytes or a size such as 8g",
    "cpu_weight": "1..10000",
    "io_weight": "1..10000",
}


def parse_size(value: Any, field: str) -> int:
    """Bytes from an int or a size text (``"4g"``, ``"512M"``, ``"1.5G"``, ``"100k"``; base
    1024). Raises ``ValueError`` naming ``field``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if isinstance(value, bool) or match is None or float(match.group(1)) <= 0:
        raise ValueError(f"limits: {field} must be {CAP_KEYS[field]}, got {value!r}")
    scale = 1024 ** " kmgt".index(match.group(2).lower() or " ")
    return int(float(match.group(1)) * scale)


def parse_caps(value: Any) -> Caps | None:
    """Desktop option / server flag ``limits``: ``False`` (no caps: the explicit opt-out),
    ``True`` or ``None`` (the defaults), or a dict overriding some of :data:`CAP_KEYS`
    (``{"pids": 512, "memory": "1g"}``). Raises ``ValueError`` naming the key and the fix."""
    if value is False:
        return None
    if value is None or value is True:
        return Caps()
    if not isinstance(value, dict):
        raise ValueError(
            f"limits must be true, false or an object of {', '.join(CAP_KEYS)}, got {value!r}"
        )
    unknown = set(value) - set(CAP_KEYS)
    if unknown:
        raise ValueError(f"limits: unknown key(s) {sorted(unknown)}; known: {', '.join(CAP_KEYS)}")
    caps = Caps()
    for key, raw in value.items():
        if key in ("memory", "disk"):
            caps = replace(caps, **{key: parse_size(raw, key)})
            continue
        if key == "cpus":
            if not isinstance(raw, int | float) or isinstance(raw, bool) or raw < 0:
                raise ValueError(f"limits: cpus must be {CAP_KEYS[key]}, got {raw!r}")
            caps = replace(caps, cpus=float(raw))
            continue
        top = 10000 if key.endswith("weight") else 1 << 22
        if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= top:
            raise ValueError(f"limits: {key} must be {CAP_KEYS[key]}, got {raw!r}")
        caps = replace(caps, **{key: raw})
    return caps


# -- cgroups -------------------------------------------------------------------------------------


class Cgroup:
    """One desktop's cgroup, v1 or v2 (:func:`make_cgroup`). ``procs``: the ``cgroup.procs``
    files a process writes its pid into to join (one per v1 hierarchy, one in v2); ``paths``:
    the cgroup directories; ``version``: 1 or 2; ``io_weighted``: an IO weight was set."""

    def __init__(self, version: int, paths: dict[str, Path], io_weighted: bool):
        self.version = version
        self.paths = paths  # controller -> directory (v2: every controller -> the one directory)
        self.io_weighted = io_weighted

    @property
    def procs(self) -> list[Path]:
        return sorted({path / "cgroup.procs" for path in self.paths.values()})

    def counts(self) -> dict[str, int]:
        """How often the kernel enforced a cap so far: ``{"pids": forks refused at pids.max,
        "memory": processes OOM-killed}`` (counters only grow)."""
        pids = _keyed(self.paths["pids"] / "pids.events").get("max", 0)
        if self.version == 2:
            oom = _keyed(self.paths["memory"] / "memory.events").get("oom_kill", 0)
        else:
            oom = _keyed(self.paths["memory"] / "memory.oom_control").get("oom_kill", 0)
        return {"pids": pids, "memory": oom}

    def members(self) -> list[int]:
        """Pids in the cgroup (its ``pids`` hierarchy's ``cgroup.procs``)."""
        try:
            return [int(p) for p in (self.paths["pids"] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self, timeout: float = 2.0) -> None:
        """Remove the cgroup directories once their processes are gone (waits up to
        ``timeout`` s for exiting ones; a cgroup still busy then is left, no error)."""
        deadline = time.monotonic() + timeout
        for path in sorted(set(self.paths.values())):
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)

    def describe(self) -> dict[str, Any]:
        return {
            "cgroup": f"v{self.version}",
            "paths": sorted({str(p) for p in self.paths.values()}),
            "io_weight_applied": self.io_weighted,
        }


def cgroup_version(root: Path = CGROUP_ROOT) -> int:
    """2 on a pure cgroup v2 host (``root/cgroup.controllers`` exists), 1 when the v1
    ``pids`` and ``memory`` hierarchies are mounted under ``root`` (hybrid hosts included: their
    ``unified`` v2 mount holds no controllers); 0 when neither."""
    if (root / "cgroup.controllers").exists():
        return 2
    if (root / "pids" / "cgroup.procs").exists() and (root / "memory" / "cgroup.procs").exists():
        return 1
    return 0


def make_cgroup(
    name: str,
    caps: Caps,
    root: Path = CGROUP_ROOT,
    self_cgroup: Path = Path("/proc/self/cgroup"),
) -> Cgroup:
    """Create cgroup ``name`` with ``caps`` (a leftover of that name is reused). ``root``: the
    cgroup mount (a fake tree in tests); ``self_cgroup``: where this process's own cgroups are
    read (v1: the new cgroup goes below them). Raises :class:`LimitsError` naming the fix."""
    version = cgroup_version(root)
    try:
        if version == 2:
            return _make_v2(name, caps, root)
        if version == 1:
            return _make_v1(name, caps, root, self_cgroup)
    except OSError as exc:
        raise LimitsError(
            f"cannot set up the desktop's cgroup ({exc.strerror}: {exc.filename}): {_FIX}"
        ) from None
    raise LimitsError(f"no cgroup hierarchy with pids and memory under {root}: {_FIX}")


_FIX = (
    "run the desktop server as root where it may create cgroups (cgroup v2: pids, memory and"
    " cpu listed in /sys/fs/cgroup/cgroup.controllers; in a container, a writable"
    " /sys/fs/cgroup, e.g. docker --cgroupns=private), or pass --desktop-option limits=false"
    " (legato desktop serve --limits false) to run desktops without resource caps (a fork"
    " bomb or memory hog then reaches the host)"
)


def _make_v2(name: str, caps: Caps, root: Path) -> Cgroup:
    available = set((root / "cgroup.controllers").read_text().split())
    missing = {"pids", "memory", "cpu"} - available
    if missing:
        raise LimitsError(
            f"cgroup v2 controllers {sorted(missing)} are not available in {root}: {_FIX}"
        )
    wanted = [c for c in ("pids", "memory", "cpu", "io") if c in available]
    parent = root / "legato"
    parent.mkdir(exist_ok=True)
    for level in (root, parent):
        enabled = set((level / "cgroup.subtree_control").read_text().split())
        todo = [c for c in wanted if c not in enabled]
        if todo:
            (level / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in todo))
    _remove_stale(parent, "")
    path = parent / name
    path.mkdir(exist_ok=True)
    _write(path / "pids.max", caps.pids)
    _write(path / "memory.max", caps.memory)
    if (path / "memory.swap.max").exists():
        _write(path / "memory.swap.max", 0)
    _write(path / "cpu.weight", caps.cpu_weight)
    _write(
        path / "cpu.max",
        f"{int(caps.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}" if caps.cpus else "max",
    )
    io = "io" in wanted and (path / "io.weight").exists()
    if io:
        _write(path / "io.weight", f"default {caps.io_weight}")
    return Cgroup(2, {c: path for c in ("pids", "memory", "cpu", "io")}, io)


def _make_v1(name: str, caps: Caps, root: Path, self_cgroup: Path) -> Cgroup:
    own = _own_v1(self_cgroup)
    paths = {}
    for ctl in ("pids", "memory", "cpu", "blkio"):
        base = root / ctl
        if not (base / "cgroup.procs").exists():
            if ctl in ("pids", "memory"):
                raise LimitsError(f"cgroup v1 hierarchy {base} is not mounted: {_FIX}")
            continue
        path = base / own.get(ctl, "/").lstrip("/") / f"legato-{name}"
        _remove_stale(path.parent, "legato-")
        path.mkdir(exist_ok=True)
        paths[ctl] = path
    _write(paths["pids"] / "pids.max", caps.pids)
    _write(paths["memory"] / "memory.limit_in_bytes", caps.memory)
    if (paths["memory"] / "memory.memsw.limit_in_bytes").exists():
        _write(paths["memory"] / "memory.memsw.limit_in_bytes", caps.memory)
    if "cpu" in paths:
        _write(paths["cpu"] / "cpu.shares", max(2, caps.cpu_weight * 1024 // 100))
        _write(paths["cpu"] / "cpu.cfs_period_us", CPU_PERIOD_US)
        quota = int(caps.cpus * CPU_PERIOD_US) if caps.cpus else -1
        _write(paths["cpu"] / "cpu.cfs_quota_us", quota)
    io = False
    for weight in ("blkio.bfq.weight", "blkio.weight"):  # 1..1000 (BFQ), 10..1000 (CFQ)
        if "blkio" in paths and (paths["blkio"] / weight).exists():
            _write(paths["blkio"] / weight, min(1000, max(10, caps.io_weight)))
            io = True
            break
    return Cgroup(1, paths, io)


def _own_v1(self_cgroup: Path) -> dict[str, str]:
    """This process's v1 cgroup path per controller (``/proc/self/cgroup``'s
    ``N:ctl[,ctl]:/path`` lines)."""
    found = {}
    for line in self_cgroup.read_text().splitlines():
        _, ctls, path = line.split(":", 2)
        for ctl in ctls.split(","):
            if ctl:
                found[ctl] = path
    return found


def _remove_stale(parent: Path, prefix: str) -> None:
    """Remove the empty cgroups ``<prefix>...-<pid>`` below ``parent`` whose server (``pid``,
    the name's last part) has ended: a server killed with SIGKILL cannot remove its own."""
    try:
        entries = [e for e in os.scandir(parent) if e.is_dir() and e.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        pid = entry.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            if not Path(entry.path, "cgroup.procs").read_text().strip():
                os.rmdir(entry.path)
        except OSError:
            pass


def release_disk(state_dir: Path) -> None:
    """Unmount a desktop's disk image left mounted on ``state_dir/sandbox`` by a server that
    was killed (SIGKILL: it could not unmount it), so that removing the state directory
    frees the loop device too. Call it once the server has ended."""
    mountpoint = Path(state_dir) / "sandbox"
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def _write(path: Path, value: Any) -> None:
    path.write_text(f"{value}\n")


def _keyed(path: Path) -> dict[str, int]:
    """``key value`` lines as a dict (``pids.events``, ``memory.events``, ``oom_control``)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


# -- disk ----------------------------------------------------------------------------------------


def disk_margin(size: int) -> int:
    """Free bytes below which the disk counts as full: 2% of ``size``, at most 32 MiB."""
    return min(32 * MIB, size // 50)


class DiskImage:
    """A sparse ext4 image file mounted (loop device, ``nosuid,nodev``) on ``mountpoint``:
    writes below it stop at ``size`` bytes with ``ENOSPC``. The image holds only what was
    written (``truncate`` makes it sparse). Raises :class:`LimitsError` when it cannot be made
    or mounted (no ``mkfs.ext4``, no loop device)."""

    def __init__(self, image: Path, mountpoint: Path, size: int):
        self.image, self.mountpoint, self.size = Path(image), Path(mountpoint), size
        self.mounted = False

    def mount(self) -> None:
        if os.path.ismount(self.mountpoint):  # a server that died left it
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.image.unlink(missing_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        os.chmod(self.image, 0o600)
        mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,nodiscard"]
        for argv in (
            [*mkfs, str(self.image)],
            ["mount", "-o", "loop,nosuid,nodev", str(self.image), str(self.mountpoint)],
        ):
            try:
                done = subprocess.run(argv, capture_output=True, text=True)
            except FileNotFoundError:
                raise LimitsError(
                    f"the disk cap needs {argv[0]} (apt-get install e2fsprogs)"
                ) from None
            if done.returncode != 0:
                raise LimitsError(
                    f"the disk cap could not be set up ({' '.join(argv[:1])}:"
                    f" {done.stderr.strip()[-300:]}): it needs root and a free loop device"
                    " (/dev/loop-control), or pass --desktop-option limits=false"
                )
        self.mounted = True

    def free(self) -> tuple[int, int]:
        """(free bytes, free inodes) of the mounted filesystem."""
        st = os.statvfs(self.mountpoint)
        return st.f_bavail * st.f_frsize, st.f_favail

    def used(self) -> int:
        """Bytes in use (``df``'s Used: data and directories, not ext4's own metadata)."""
        st = os.statvfs(self.mountpoint)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def full(self) -> bool:
        """Less than :func:`disk_margin` bytes, or no inode, left."""
        if not self.mounted:
            return False
        space, inodes = self.free()
        return space < disk_margin(self.size) or inodes == 0

    def unmount(self) -> None:
        """Unmount (lazily: a process that still holds a file keeps it until it lets go; the
        loop device is released then) and delete the image."""
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
            self.mounted = False
        self.image.unlink(missing_ok=True)


# -- one desktop's caps --------------------------------------------------------------------------


class DesktopLimits:
    """Everything capped for one desktop: its :class:`Cgroup` and :class:`DiskImage`.

    ``caps``: the :class:`Caps`; ``name``: unique per desktop on the host (the cgroup's name);
    ``sandbox_dir``: the directory the disk image is mounted on. :meth:`setup` makes both
    (raises :class:`LimitsError`); :meth:`close` removes them.
    """

    def __init__(self, caps: Caps, name: str, sandbox_dir: Path, cgroup_root: Path = CGROUP_ROOT):
        self.caps, self.name = caps, name
        self.disk = DiskImage(Path(f"{sandbox_dir}.img"), Path(sandbox_dir), caps.disk)
        self.cgroup_root = cgroup_root
        self.cgroup: Cgroup | None = None
        self.tripped: str | None = None
        self._base: dict[str, int] = {}

    def setup(self) -> None:
        """Mount the disk image on the sandbox directory and make the cgroup."""
        self.cgroup = make_cgroup(self.name, self.caps, self.cgroup_root)
        try:
            self.disk.mount()
        except LimitsError:
            self.cgroup.remove()
            raise
        self.rebase()

    def join_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run as a member of the cgroup: the host's ``/bin/sh`` joins (writes its pid
        into every ``cgroup.procs``) and then executes ``argv``; it exits 125 when it cannot
        join, before ``argv`` runs."""
        if self.cgroup is None:
            return list(argv)
        files = [str(p) for p in self.cgroup.procs]
        return ["/bin/sh", "-c", JOIN_SCRIPT, "legato-join", *files, "--", *argv]

    def rebase(self) -> None:
        """Forget earlier hits: from now on only new enforcement counts (call at every reset,
        once the sandbox is clean)."""
        self.tripped = None
        self._base = self.cgroup.counts() if self.cgroup is not None else {}

    def check(self) -> str | None:
        """The cap hit since :meth:`rebase` (``pids``, ``memory`` or ``disk``; the first one
        seen stays), else ``None``."""
        if self.tripped is None and self.cgroup is not None:
            counts = self.cgroup.counts()
            for cap in ("pids", "memory"):
                if counts.get(cap, 0) > self._base.get(cap, 0):
                    self.tripped = cap
                    break
        if self.tripped is None and self.disk.full():
            self.tripped = "disk"
        return self.tripped

    def message(self, cap: str) -> str:
        """What to tell the engine about hit cap ``cap``."""
        what = {
            "pids": f"pids: the desktop reached its {self.caps.pids} processes (a fork refused)",
            "memory": f"memory: a process of the desktop was OOM-killed at its"
            f" {_size(self.caps.memory)} cap",
            "disk": f"disk: the desktop's disk ({_size(self.caps.disk)}) is full",
        }[cap]
        return f"resource cap hit: {what}; the desktop is reverted at the next reset"

    def close(self) -> None:
        """Remove the cgroup (its processes must be dead) and unmount the disk image."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        self.disk.unmount()

    def describe(self) -> dict[str, Any]:
        """For ``/legato/health``: the caps, the cgroup, the disk's free bytes, any hit."""
        found: dict[str, Any] = {"caps": self.caps.to_json(), "hit": self.check()}
        if self.cgroup is not None:
            found |= self.cgroup.describe()
        if self.disk.mounted:
            found["disk_free"], found["disk_used"] = self.disk.free()[0], self.disk.used()
        return found


def _size(n: int) -> str:
    return f"{n / GIB:g} GiB" if n >= GIB else f"{n / MIB:g} MiB"
