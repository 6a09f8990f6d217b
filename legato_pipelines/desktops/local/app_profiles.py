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
process group is killed when it ends. Servers starting at once build it once (a lock file);
the build lands by an atomic rename, so a killed build leaves nothing a later start would take.
Entries that are links, not the user's own or writable by others are not used.
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
from collections.abc import Mapping
from pathlib import Path

#: Where LibreOffice keeps its user profile inside HOME (``-env:UserInstallation`` default).
LIBREOFFICE_PROFILE = ".config/libreoffice"
LIBREOFFICE_REGISTRY = f"{LIBREOFFICE_PROFILE}/4/user/registrymodifications.xcu"
#: Files that tell one LibreOffice build from another (Debian's layout): the build id and
#: vendor (``versionrc``, hashed whole) and the configuration schema (size and time).
LIBREOFFICE_VERSIONRC = Path("/usr/lib/libreoffice/program/versionrc")
LIBREOFFICE_MAIN_XCD = Path("/usr/lib/libreoffice/share/registry/main.xcd")
#: Bumped when the way the profile is built changes, so older cache entries are not used.
RECIPE_VERSION = "1"
#: Seconds soffice may take (~0.3 s on an idle machine); well under a server's start timeout.
BUILD_TIMEOUT_S = 20.0


class ProfileError(RuntimeError):
    """The profile could not be built or cached; the message says why and what to do."""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/legato/app-profiles`` (else ``~/.cache/legato/app-profiles``) of the
    user this process runs as."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "legato" / "app-profiles"


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
    :data:`BUILD_TIMEOUT_S` seconds, or when the cache cannot be used (not writable, a link,
    another user's): the message names the directory and the fix.
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
        _check_owned(root)
        lock_fd = os.open(root / "build.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a server starting beside us may be building it
            if not _usable(target):
                _build(soffice, env, root, target)
        finally:
            os.close(lock_fd)
    except OSError as exc:
        raise ProfileError(
            f"cannot use the profile cache {root}: {exc} (fix: make it writable by this user, "
            "set XDG_CACHE_HOME to a directory that is, or turn the profile off: --prebuild "
            "none, desktop option prebuild=[])"
        ) from None
    return target


def _usable(target: Path) -> bool:
    """``target`` is a finished build this user can trust: a real directory (not a link) of
    its own, writable by no one else, holding the profile's registry."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    _check_owned(target, st)
    if not stat.S_ISDIR(st.st_mode):
        raise ProfileError(f"{target} is not a directory (fix: remove it)")
    return (target / LIBREOFFICE_REGISTRY).is_file()


def _check_owned(path: Path, st: os.stat_result | None = None) -> None:
    st = st or os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ProfileError(
            f"{path} is a link, another user's, or writable by others: not used (fix: remove "
            "it, or set XDG_CACHE_HOME to a directory of this user's)"
        )


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
    lock held, so any other build directory is one a killed build left)."""
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
        stderr = _run_soffice(soffice, build_env, home)
        if not (home / LIBREOFFICE_REGISTRY).is_file():
            raise ProfileError(f"soffice did not create a profile: {stderr or 'no output'}")
        for path in [home, *home.rglob("*")]:  # readable by every desktop user; copies are chowned
            if not path.is_symlink():
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
        os.rename(home, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_soffice(soffice: str, env: dict[str, str], home: Path) -> str:
    """Run soffice's first start headless in its own process group, killed whole when it
    ends or times out; answers the tail of its stderr."""
    proc = subprocess.Popen(
        [soffice, "--headless", "--norestore", "--terminate_after_init"],
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProfileError(
            f"soffice did not build its profile within {BUILD_TIMEOUT_S:.0f} s"
        ) from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # oosplash's soffice.bin and anything it left
        except ProcessLookupError:
            pass
        proc.wait()
    return err.decode(errors="replace").strip()[-300:]
