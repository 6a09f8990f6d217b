"""App profiles pre-built once per machine and copied into every baseline HOME (issue 18).

LibreOffice creates its user profile (``~/.config/libreoffice/4/user``) on its first start in a
HOME without one, and every reset restores HOME from the baseline, so without a profile in the
baseline every LibreOffice task paid that creation again: a Calc cold start (reset -> setup ->
ready) took 1.5-2.0 s with it and 1.4-1.5 s with a profile (BENCHMARKS.md, issue 18 part 10),
and ~1 s against 0.2-0.45 s to the mapped window on an idle machine (docs/local-desktop.md §3).
OSWorld's VM has one too: its snapshot is a desktop where LibreOffice has run.

The profile is what ``soffice --headless --norestore --terminate_after_init`` writes into an
empty HOME (~0.3 s of CPU, 15 files, 0.3 MB), built once per LibreOffice build and locale and
kept in ``$XDG_CACHE_HOME/legato/app-profiles/`` (else ``~/.cache``): a desktop server copies
it into its baseline instead of running soffice at its start. Servers starting at once build
it once (a lock file); the build lands by an atomic rename, so a killed build leaves nothing
a later start would take.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: Where LibreOffice keeps its user profile inside HOME (``-env:UserInstallation`` default).
LIBREOFFICE_PROFILE = ".config/libreoffice"
#: Files that tell one LibreOffice build from another (Debian's layout): the build id and
#: vendor (``versionrc``) and the configuration schema the profile is written against.
LIBREOFFICE_BUILD_FILES = (
    Path("/usr/lib/libreoffice/program/versionrc"),
    Path("/usr/lib/libreoffice/share/registry/main.xcd"),
)
BUILD_TIMEOUT_S = 120.0


class ProfileError(RuntimeError):
    """The profile could not be built; the message says why and what to install."""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/legato/app-profiles`` (else ``~/.cache/legato/app-profiles``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "legato" / "app-profiles"


def libreoffice_installed() -> bool:
    """Whether ``soffice`` is on ``PATH``."""
    return shutil.which("soffice") is not None


def libreoffice_profile(env: Mapping[str, str], root: Path | None = None) -> Path:
    """A directory shaped like a HOME holding only LibreOffice's pre-built profile
    (:data:`LIBREOFFICE_PROFILE`), built now unless the cache under ``root`` (default
    :func:`cache_root`) has the one of this LibreOffice build and ``env``'s locale.

    ``env``: the desktop's task environment (``PATH``, ``LANG``: the profile records the
    locale); ``HOME``, the XDG folders and ``DISPLAY`` are replaced (soffice runs headless in
    an empty HOME of its own). Copy the answer into a baseline (e.g. as a ``template`` of
    :func:`.home.build_baseline`); never write into it.

    Raises :class:`ProfileError` when soffice is not installed, fails, or runs longer than
    :data:`BUILD_TIMEOUT_S` seconds.
    """
    soffice = shutil.which("soffice", path=env.get("PATH"))
    if soffice is None:
        raise ProfileError("soffice is not installed (apt-get install libreoffice-calc)")
    root = root or cache_root()
    target = root / f"libreoffice-{_build_key(soffice, env)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a server that started beside us may be building it
        if not target.is_dir():
            _build(soffice, env, root, target)
    return target


def _build_key(soffice: str, env: Mapping[str, str]) -> str:
    """A short hash of what the profile depends on: the LibreOffice build (its build files'
    bytes or, off Debian's layout, the soffice binary's size and time) and the locale."""
    digest = hashlib.sha256(env.get("LANG", "").encode())
    for path in (*LIBREOFFICE_BUILD_FILES, Path(os.path.realpath(soffice))):
        try:
            st = path.stat()
        except OSError:
            continue
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _build(soffice: str, env: Mapping[str, str], root: Path, target: Path) -> None:
    for stale in root.glob(".build-*"):  # a build killed before its clean-up (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        home = work / "home"
        home.mkdir()
        build_env = {
            k: v for k, v in env.items() if k not in ("DISPLAY", "DBUS_SESSION_BUS_ADDRESS")
        }
        build_env |= {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(work / "cache"),
            "XDG_DATA_HOME": str(work / "data"),
            "XDG_STATE_HOME": str(work / "state"),
            "GSETTINGS_BACKEND": "memory",
        }
        try:
            done = subprocess.run(
                [soffice, "--headless", "--norestore", "--terminate_after_init"],
                env=build_env,
                cwd=home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=BUILD_TIMEOUT_S,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise ProfileError(
                f"soffice did not build its profile within {BUILD_TIMEOUT_S:.0f} s"
            ) from None
        profile = home / LIBREOFFICE_PROFILE
        if not (profile / "4" / "user" / "registrymodifications.xcu").is_file():
            message = done.stderr.decode(errors="replace").strip()[-300:]
            raise ProfileError(
                f"soffice (exit {done.returncode}) did not create a profile: {message or 'no output'}"
            )
        for path in [home, *home.rglob("*")]:  # readable by every desktop user; copies are chowned
            if not path.is_symlink():
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
        os.rename(home, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
