"""The desktop user's HOME: a baseline built once, restored with ``rm -rf`` + ``cp -a``.

The baseline disables caret blinking (GTK 2/3/4 settings), so the ready signal does not see
a blinking caret as "still changing" (docs/local-desktop.md §6), and holds the usual XDG
folders. Restoring is ``rm -rf HOME && cp -a BASELINE HOME`` (13 ms for a 0.5 MB HOME, half
the cost of ``rsync --delete``; docs/local-desktop.md §7); ``cp -a`` keeps the owner.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

#: VLC's Lua HTTP interface as OSWorld's getters read it (desktop_env/evaluators/getters/vlc.py
#: ``get_vlc_playing_info``: ``GET http://<vm_ip>:<vlc_port>/requests/status.xml`` with basic
#: auth ``('', 'password')``); 8080 is the guest port OSWorld's providers map as ``vlc_port``.
VLC_HTTP_PORT = 8080
VLC_HTTP_PASSWORD = "password"
#: ``~/.config/vlc/vlcrc``: the HTTP interface on as OSWorld's VM has it, bound to the desktop's
#: loopback only (the password is public), and no "Privacy and Network Access Policy" dialog on
#: the first start (docs/local-desktop.md §11). VLC looks options up by name; the section
#: headers are the ones VLC writes itself.
VLCRC = (
    f"[core]\nextraintf=http\nhttp-host=127.0.0.1\nhttp-port={VLC_HTTP_PORT}\n"
    f"[lua]\nhttp-password={VLC_HTTP_PASSWORD}\n"
    "[qt]\nqt-privacy-ask=0\n"
)
#: Files of the baseline HOME (path relative to HOME -> content).
BASELINE_FILES: dict[str, str] = {
    ".config/gtk-3.0/settings.ini": "[Settings]\ngtk-cursor-blink=false\ngtk-enable-animations=false\n",
    ".config/gtk-4.0/settings.ini": "[Settings]\ngtk-cursor-blink=false\ngtk-enable-animations=false\n",
    ".gtkrc-2.0": "gtk-cursor-blink = 0\n",
    ".config/vlc/vlcrc": VLCRC,
    ".config/user-dirs.dirs": (
        'XDG_DESKTOP_DIR="$HOME/Desktop"\nXDG_DOCUMENTS_DIR="$HOME/Documents"\n'
        'XDG_DOWNLOAD_DIR="$HOME/Downloads"\nXDG_PICTURES_DIR="$HOME/Pictures"\n'
        'XDG_MUSIC_DIR="$HOME/Music"\nXDG_VIDEOS_DIR="$HOME/Videos"\n'
    ),
}
BASELINE_DIRS: tuple[str, ...] = (
    "Desktop",
    "Documents",
    "Downloads",
    "Pictures",
    "Music",
    "Videos",
    ".cache",
    ".local/share",
    ".local/state",
)


def build_baseline(
    baseline: Path, *, uid: int | None, gid: int | None, template: Path | None = None
) -> None:
    """Create the baseline HOME at ``baseline`` (replacing what is there), owned by uid/gid.

    ``template``: a directory copied in first (e.g. pre-built app profiles); the blink-off
    settings are written over it.
    """
    if baseline.exists():
        shutil.rmtree(baseline)
    if template is not None:
        shutil.copytree(template, baseline, symlinks=True)
    baseline.mkdir(parents=True, exist_ok=True)
    for rel in BASELINE_DIRS:
        (baseline / rel).mkdir(parents=True, exist_ok=True)
    for rel, text in BASELINE_FILES.items():
        path = baseline / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    os.chmod(baseline, 0o700)
    if uid is not None:
        _chown_tree(baseline, uid, gid if gid is not None else uid)


#: LibreOffice settings for a pre-built profile: no first-run wizard, no tip-of-the-day dialog.
LIBREOFFICE_ITEMS = (
    '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop></item>',
    '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop></item>',
)
LIBREOFFICE_REGISTRY = ".config/libreoffice/4/user/registrymodifications.xcu"


def add_libreoffice_settings(home: Path) -> None:
    """Write :data:`LIBREOFFICE_ITEMS` into the profile's ``registrymodifications.xcu``.

    Raises ``FileNotFoundError`` when the profile has not been built.
    """
    registry = home / LIBREOFFICE_REGISTRY
    text = registry.read_text()
    missing = "".join(item for item in LIBREOFFICE_ITEMS if item not in text)
    registry.write_text(text.replace("</oor:items>", missing + "</oor:items>"))


def restore(baseline: Path, home: Path) -> None:
    """Make ``home`` an exact copy of ``baseline`` (owner, modes and links kept). A ``home``
    that is a symlink or a file is removed as such, never followed.

    Raises ``RuntimeError`` with ``cp``'s message when the copy fails.
    """
    try:
        mode = os.lstat(home).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        shutil.rmtree(home)  # fd-based on Linux: follows no link inside
    elif mode is not None:  # a link (root inside may have made HOME one) or a file: never followed
        os.unlink(home)
    done = subprocess.run(
        ["cp", "-a", "--", str(baseline), str(home)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"restoring HOME from the baseline failed: {done.stderr.strip()}")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)
