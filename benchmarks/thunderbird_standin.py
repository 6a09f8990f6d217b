"""A stand-in for OSWorld's ``thunderbird-profile.tar.gz``, so its Thunderbird configs run offline.

Every OSWorld Thunderbird config downloads a used profile from Hugging Face
(``thunderbird-profile.tar.gz``: ``.thunderbird/`` with the profile ``t5q2a5hp.default-release``
and its mail account), unpacks it over HOME and launches Thunderbird. This machine has no
internet, so for the benchmarks this builds a tarball of the same shape: the same profile
folder, made a used one by a real Thunderbird start (headless; 10-35 s in all here), with a Local Folders
account and the first-start windows off (the baseline HOME's ``user.js`` prefs,
``legato_pipelines/desktops/server/home.py``) instead of OSWorld's Outlook account. It is written
under the URL's own file name into a file cache directory, where the local backend's
``download`` steps find it (``--desktop-option cache_dir=DIR``; docs/osworld.md §10).

What it leaves out: OSWorld's account, its mail and filters; graders reading them score 0 (the
prefs-based ones read ``prefs.js`` as usual). Timings of a start with it are those of a used
profile with no mail; OSWorld's profile holds an IMAP account Thunderbird tries to reach.

    python benchmarks/thunderbird_standin.py --cache-dir /tmp/tb-cache
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from legato_pipelines.desktops.server.home import (
    THUNDERBIRD_INSTALL_HASH,
    THUNDERBIRD_PREFS,
    _user_js,
)

PROFILE = "t5q2a5hp.default-release"  # the folder OSWorld's tarball holds and its graders read
TARBALL = "thunderbird-profile.tar.gz"
#: files a first start writes once the profile is in use; it is stopped after they exist
WRITTEN = ("compatibility.ini", "times.json", "xulstore.json")
START_TIMEOUT_S = 60.0


def build(cache_dir: Path) -> Path:
    """Write ``cache_dir/thunderbird-profile.tar.gz`` (see the module docstring) and return its
    path. Raises ``RuntimeError`` when Thunderbird is not installed or does not start."""
    thunderbird = shutil.which("thunderbird")
    if thunderbird is None:
        raise RuntimeError("thunderbird is not installed (apt-get install thunderbird)")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        root = home / ".thunderbird"
        profile = root / PROFILE
        profile.mkdir(parents=True)
        (root / "profiles.ini").write_text(
            f"[Install{THUNDERBIRD_INSTALL_HASH}]\nDefault={PROFILE}\nLocked=1\n\n"
            f"[Profile0]\nName=default-release\nIsRelative=1\nPath={PROFILE}\nDefault=1\n\n"
            "[General]\nStartWithLastProfile=1\nVersion=2\n"
        )
        (root / "installs.ini").write_text(
            f"[{THUNDERBIRD_INSTALL_HASH}]\nDefault={PROFILE}\nLocked=1\n"
        )
        (profile / "user.js").write_text(_user_js(THUNDERBIRD_PREFS))
        env = {
            "HOME": str(home),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "GSETTINGS_BACKEND": "memory",
        }
        proc = subprocess.Popen(
            [thunderbird, "--headless"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not all((profile / name).exists() for name in WRITTEN):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"thunderbird did not make the profile a used one (exit {proc.poll()})"
                    )
                time.sleep(0.2)
            time.sleep(2.0)  # let it finish its first-start writes
        finally:
            _stop(proc)
        for lock in ("lock", ".parentlock"):
            (profile / lock).unlink(missing_ok=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        out = cache_dir / TARBALL
        # written under a name of its own, then renamed: no truncated tarball, even killed
        fd, partial = tempfile.mkstemp(prefix=f".{TARBALL}.", dir=cache_dir)
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                tar.add(root, arcname=".thunderbird")
            os.chmod(partial, 0o644)
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to Thunderbird's process group (the profile's files, prefs.js included, are
    written by then), then SIGKILL to whatever of the group is left, 20 s later at most;
    another SIGTERM meanwhile does not cut this short."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    # SIGTERM (``timeout``, a killed benchmark) ends through the clean-up below like Ctrl-C:
    # Thunderbird's process group is stopped and the temporary HOME removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache-dir", type=Path, required=True, help="the file cache to write into")
    print(build(ap.parse_args().cache_dir))


if __name__ == "__main__":
    main()
