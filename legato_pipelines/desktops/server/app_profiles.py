"""App profiles pre-built once and copied into every baseline HOME (issue 18).

LibreOffice creates its user profile (``~/.config/libreoffice/4/user``) on its first start in a
HOME without one, and every reset restores HOME from the baseline, so without a profile in the
baseline every LibreOffice task paid that creation again: a Calc preparation (reset, setup,
ready) in a batch took 1.58-2.01 s without it and 1.38-1.53 s with it (BENCHMARKS.md, issue 18
part 10), and the window came after ~1 s against 0.2-0.45 s on an idle machine
(docs/local-desktop.md §3). OSWorld's VM has one too: its snapshot is a desktop where
LibreOffice has run.

The profile is what ``soffice --headless --norestore --terminate_after_init`` writes into an
empty HOME (~0.3 s of CPU; 14 files, 0.17 MB), built once per LibreOffice build and locale by
the user the desktop servers run as and kept in their ``$XDG_CACHE_HOME/legato/app-profiles/``
(else ``~/.cache``): a server copies it into its baseline instead of running soffice at its
start. soffice runs with everything it may write (HOME, the XDG folders, ``XDG_RUNTIME_DIR``,
``TMPDIR``) inside a build directory of the cache, so nothing lands on the host, and its
process group is killed when it ends. Servers starting at once build it once (a lock file,
waited for :data:`LOCK_WAIT_S` seconds at most); the build lands by an atomic rename, so a
killed build leaves nothing a later start would take; a failed one is remembered for
:data:`FAILED_FOR_S` seconds (``<entry>.failed``), so the servers starting meanwhile do not
wait for soffice again. Entries that are links, not the user's own or writable by others are
not used. Every failure is a :class:`ProfileError`; a desktop server then starts without the
profile (a warning) unless it was asked for (:class:`.session.Session`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ...user_cache import legato_cache

#: Where LibreOffice keeps its user profile inside HOME (``-env:UserInstallation`` default).
LIBREOFFICE_PROFILE = ".config/libreoffice"
LIBREOFFICE_REGISTRY = f"{LIBREOFFICE_PROFILE}/4/user/registrymodifications.xcu"
#: Files that tell one LibreOffice build from another (Debian's layout): the build id and
#: vendor (``versionrc``, hashed whole) and the configuration schema (size and time).
LIBREOFFICE_VERSIONRC = Path("/usr/lib/libreoffice/program/versionrc")
LIBREOFFICE_MAIN_XCD = Path("/usr/lib/libreoffice/share/registry/main.xcd")
#: Bumped when the way the profile is built changes, so older cache entries are not used.
RECIPE_VERSION = "1"
#: Seconds soffice may take (~0.3 s on an idle machine): with :data:`LOCK_WAIT_S`, well under
#: a desktop server's start timeout (30 s), so a hanging soffice costs a start, not the start.
BUILD_TIMEOUT_S = 10.0
#: Seconds a server waits for another's build before going on without the profile.
LOCK_WAIT_S = BUILD_TIMEOUT_S + 2.0
#: Seconds a failed build is remembered (``<entry>.failed``): servers starting meanwhile go on
#: without the profile at once instead of each waiting for soffice again.
FAILED_FOR_S = 600.0


class ProfileError(RuntimeError):
    """The profile could not be built or cached; the message says why and what to do."""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/legato/app-profiles`` (else ``~/.cache/legato/app-profiles``) of the
    user this process runs as."""
    return legato_cache("app-profiles")


def libreoffice_installed(path: str | None = None) -> bool:
    """Whether ``soffice`` is on ``path`` (a ``PATH`` string; default: this process's)."""
    return shutil.which("soffice", path=path) is not None


def libreoffice_profile(env: Mapping[str, str], root: Path | None = None) -> Path:
    """A directory shaped like a HOME holding only LibreOffice's pre-built profile
    (:data:`LIBREOFFICE_PROFILE`), built now unless the cache under ``root`` (default
    :func:`cache_root`) has the one of this LibreOffice build and ``env``'s locale.

    ``env``: the desktop's task environment, of which only ``PATH`` (to find soffice) and
    ``LANG`` (the profile records the locale) are used. Copy the answer into a baseline (e.g.
    as one of the ``templates`` of :func:`.home.build_baseline`); never write into it.

    Raises :class:`ProfileError` when soffice is not installed, fails or runs longer than
    :data:`BUILD_TIMEOUT_S` seconds (or did so in the last :data:`FAILED_FOR_S` seconds),
    when another build holds the cache longer than :data:`LOCK_WAIT_S` seconds, or when the
    cache cannot be used (not writable, a link, another user's): the message names the
    directory and the fix.
    """
    soffice = shutil.which("soffice", path=env.get("PATH"))
    if soffice is None:
        raise ProfileError("soffice is not installed (apt-get install libreoffice-calc)")
    root = root or cache_root()
    target = root / f"libreoffice-{_build_key(soffice, env)}"
    try:
        if _usable(target):
            return target
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        _own_directory(root)
        lock_fd = os.open(root / "build.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            _lock(lock_fd, root)  # a server starting beside us may be building it
            if not _usable(target):
                _build(soffice, env, root, target)
        finally:
            os.close(lock_fd)
    except ProfileError as exc:
        raise ProfileError(f"{exc}; {OFF}") from None
    except OSError as exc:
        raise ProfileError(
            f"cannot use the profile cache {root}: {exc} (fix: make it writable by this user "
            f"or set XDG_CACHE_HOME to a directory that is); {OFF}"
        ) from None
    return target


OFF = "or go without the profile: --prebuild none, desktop option prebuild=[]"


def _lock(fd: int, root: Path) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ProfileError(
                    f"another build has held {root / 'build.lock'} for over {LOCK_WAIT_S:.0f} s"
                ) from None
            time.sleep(0.05)


def _usable(target: Path) -> bool:
    """``target`` is a finished build this user can trust: a real directory (not a link) of
    its own, writable by no one else, holding the profile's registry. Raises
    :class:`ProfileError` for an entry it must not use, or when there is none and its build
    failed lately."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None:
        problem = _trust_problem(st)
        if problem:
            raise ProfileError(f"{target} is {problem}: not used (fix: remove it)")
        if not stat.S_ISDIR(st.st_mode):
            raise ProfileError(f"{target} is not a directory (fix: remove it)")
        if (target / LIBREOFFICE_REGISTRY).is_file():
            return True
    failed = _failed_note(target)
    try:
        since = time.time() - os.lstat(failed).st_mtime
    except FileNotFoundError:
        return False
    if since < FAILED_FOR_S:
        raise ProfileError(
            f"its build failed {since:.0f} s ago: {_read_note(failed)} (retried "
            f"{FAILED_FOR_S - since:.0f} s from now, or at once when {failed} is removed)"
        )
    return False


def _failed_note(target: Path) -> Path:
    return target.with_name(target.name + ".failed")


def _trust_problem(st: os.stat_result) -> str | None:
    """Why an entry with this ``lstat`` must not be used, or ``None``."""
    if stat.S_ISLNK(st.st_mode):
        return "a link"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not this user's"
    if st.st_mode & 0o022:
        return "writable by others"
    return None


def _own_directory(root: Path) -> None:
    """The cache directory is this user's real directory; its group and world write bits
    (a umask of 002 leaves them) are cleared, as nobody else may add entries."""
    st = os.lstat(root)
    problem = _trust_problem(st)
    if problem == "writable by others" and stat.S_ISDIR(st.st_mode):
        os.chmod(root, stat.S_IMODE(st.st_mode) & ~0o022, follow_symlinks=False)
    elif problem or not stat.S_ISDIR(st.st_mode):
        raise ProfileError(
            f"{root} is {problem or 'not a directory'}: not used (fix: remove it, or set "
            "XDG_CACHE_HOME to a directory of this user's)"
        )


def _read_note(path: Path) -> str:
    try:
        return path.read_text()[:300]
    except OSError:
        return "no reason kept"


def _build_key(soffice: str, env: Mapping[str, str]) -> str:
    """A short hash of what the profile depends on: the recipe, the locale, ``versionrc``'s
    bytes, and the size and time of ``main.xcd`` and of the soffice binary (a package upgrade
    changes them)."""
    digest = hashlib.sha256(f"{RECIPE_VERSION}\0{env.get('LANG', '')}\0".encode())
    try:
        digest.update(LIBREOFFICE_VERSIONRC.read_bytes())
    except OSError:
        pass
    for path in (LIBREOFFICE_MAIN_XCD, Path(os.path.realpath(soffice))):
        try:
            st = path.stat()
        except OSError:
            continue
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _build(soffice: str, env: Mapping[str, str], root: Path, target: Path) -> None:
    """Build into a fresh directory of ``root`` and rename it to ``target`` (called with the
    lock held, so any other build directory is one a killed build left). A build that fails
    leaves ``<target>.failed`` with its reason (:data:`FAILED_FOR_S`)."""
    for stale in root.glob(".build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if os.path.lexists(target):  # an unfinished entry (no registry): replaced
        shutil.rmtree(target)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        home = work / "home"
        folders = {name: work / name for name in ("cache", "data", "state", "run", "tmp")}
        for path in (home, *folders.values()):
            path.mkdir(mode=0o700)
        build_env = {
            "PATH": env.get("PATH", os.defpath),
            "LANG": env.get("LANG", "C.UTF-8"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(folders["cache"]),
            "XDG_DATA_HOME": str(folders["data"]),
            "XDG_STATE_HOME": str(folders["state"]),
            "XDG_RUNTIME_DIR": str(folders["run"]),
            "TMPDIR": str(folders["tmp"]),
            "GSETTINGS_BACKEND": "memory",
        }
        try:
            stderr = _run_soffice(soffice, build_env, home, work / "soffice.err")
            if not (home / LIBREOFFICE_REGISTRY).is_file():
                raise ProfileError(f"soffice did not create a profile: {stderr or 'no output'}")
        except ProfileError as exc:
            failed = _failed_note(target)
            failed.unlink(missing_ok=True)
            failed.write_text(str(exc))
            raise
        for path in [home, *home.rglob("*")]:  # readable by every desktop user; copies are chowned
            if not path.is_symlink():
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
        os.rename(home, target)
        _failed_note(target).unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_soffice(soffice: str, env: dict[str, str], home: Path, err: Path) -> str:
    """Run soffice's first start headless in its own process group, killed whole when it
    ends or times out (before the leader is reaped, so the group's id cannot have been
    reused); answers the tail of its stderr (kept in ``err``)."""
    with open(err, "wb") as err_file:
        proc = subprocess.Popen(
            [soffice, "--headless", "--norestore", "--terminate_after_init"],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + BUILD_TIMEOUT_S
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() > deadline:
                raise ProfileError(
                    f"soffice did not build its profile within {BUILD_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.02)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # oosplash's soffice.bin and anything it left
        except ProcessLookupError:
            pass
        proc.wait()
    return err.read_bytes().decode(errors="replace").strip()[-300:]
