"""The desktop user's HOME: a baseline built once, restored with ``rm -rf`` + ``cp -a``.

The baseline disables caret blinking (GTK 2/3/4 settings), so the ready signal does not see
a blinking caret as "still changing" (docs/local-desktop.md §6), holds the usual XDG
folders, and the app settings OSWorld's VM has: VLC's HTTP interface, LibreOffice and
Thunderbird with their first-start windows off (docs/local-desktop.md §11). Restoring is
``rm -rf HOME && cp -a BASELINE HOME`` (13 ms for a 0.5 MB HOME, half the cost of
``rsync --delete``; docs/local-desktop.md §7); ``cp -a`` keeps the owner.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Sequence
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
#: Thunderbird: a profile of its own (``~/.thunderbird``, the folder OSWorld's profile tarballs
#: unpack into) with a Local Folders account only, and the first-start windows off: the account
#: hub, the default-client question, the start page, the telemetry and rights notices, the
#: donation appeal. OSWorld's thunderbird configs replace the profile with their own.
THUNDERBIRD_PROFILE = ".thunderbird/legato.default"
#: Thunderbird keeps one default profile per installation, keyed by a hash of its install
#: folder; without this key it ignores ``Default=1`` and makes a new profile. This is the key of
#: Debian's ``/usr/lib/thunderbird`` (Thunderbird writes it into ``installs.ini``).
THUNDERBIRD_INSTALL_HASH = "FDC34C9F024745EB"
THUNDERBIRD_PREFS = {
    "mail.provider.suppress_dialog_on_startup": True,
    "mail.shell.checkDefaultClient": False,
    "mailnews.start_page.enabled": False,
    "mail.spotlight.firstRunDone": True,
    "mail.rights.version": 1,
    "app.donation.eoy.version.viewed": 999,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "mail.accountmanager.accounts": "account1",
    "mail.accountmanager.localfoldersserver": "server1",
    "mail.account.account1.server": "server1",
    "mail.server.server1.type": "none",
    "mail.server.server1.hostname": "Local Folders",
    "mail.server.server1.name": "Local Folders",
    "mail.server.server1.userName": "nobody",
    "mail.server.server1.directory-rel": "[ProfD]Mail/Local Folders",
}


def _user_js(prefs: dict[str, bool | int | str]) -> str:
    """Mozilla's ``user.js``: one ``user_pref(name, value);`` a line, values as JSON."""
    return "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in prefs.items())


#: Files of the baseline HOME (path relative to HOME -> content).
BASELINE_FILES: dict[str, str] = {
    ".config/gtk-3.0/settings.ini": "[Settings]\ngtk-cursor-blink=false\ngtk-enable-animations=false\n",
    ".config/gtk-4.0/settings.ini": "[Settings]\ngtk-cursor-blink=false\ngtk-enable-animations=false\n",
    ".gtkrc-2.0": "gtk-cursor-blink = 0\n",
    ".config/vlc/vlcrc": VLCRC,
    ".thunderbird/profiles.ini": (
        f"[Install{THUNDERBIRD_INSTALL_HASH}]\nDefault={THUNDERBIRD_PROFILE.split('/')[1]}\n"
        "Locked=1\n\n"
        f"[Profile0]\nName=default\nIsRelative=1\nPath={THUNDERBIRD_PROFILE.split('/')[1]}\n"
        "Default=1\n\n[General]\nStartWithLastProfile=1\nVersion=2\n"
    ),
    ".thunderbird/installs.ini": (
        f"[{THUNDERBIRD_INSTALL_HASH}]\nDefault={THUNDERBIRD_PROFILE.split('/')[1]}\nLocked=1\n"
    ),
    f"{THUNDERBIRD_PROFILE}/user.js": _user_js(THUNDERBIRD_PREFS),
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
    baseline: Path, *, uid: int | None, gid: int | None, templates: Sequence[Path] = ()
) -> None:
    """Create the baseline HOME at ``baseline`` (replacing what is there), owned by uid/gid.

    ``templates``: directories copied in first, in order, a later one's files over an earlier
    one's (e.g. a pre-built LibreOffice profile, :mod:`.app_profiles`, then the user's
    ``template``); the files of :data:`BASELINE_FILES` are written over them and the
    LibreOffice settings merged into the profile (:func:`add_libreoffice_settings`).
    """
    if baseline.exists():
        shutil.rmtree(baseline)
    for template in templates:
        shutil.copytree(template, baseline, symlinks=True, dirs_exist_ok=True)
    baseline.mkdir(parents=True, exist_ok=True)
    for rel in BASELINE_DIRS:
        (baseline / rel).mkdir(parents=True, exist_ok=True)
    for rel, text in BASELINE_FILES.items():
        path = baseline / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    add_libreoffice_settings(baseline, create=True)
    os.chmod(baseline, 0o700)
    if uid is not None:
        _chown_tree(baseline, uid, gid if gid is not None else uid)


#: LibreOffice's first-start windows, off in the baseline profile: the first-run wizard, the
#: tip-of-the-day dialog (Writer, Calc), Impress's "Select a Template" dialog. The "what's new"
#: infobar shows while ``ooSetupLastVersion`` is older than the installed version, so that is
#: set to the installed one (:func:`libreoffice_items`).
LIBREOFFICE_ITEMS = (
    '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop></item>',
    '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop></item>',
    '<item oor:path="/org.openoffice.Office.Impress/Misc/NewDoc"><prop oor:name="AutoPilot" oor:op="fuse"><value>false</value></prop></item>',
)
LIBREOFFICE_REGISTRY = ".config/libreoffice/4/user/registrymodifications.xcu"
#: Where Debian's LibreOffice declares its version (``ooSetupVersion``, e.g. ``7.4``).
LIBREOFFICE_MAIN_XCD = Path("/usr/lib/libreoffice/share/registry/main.xcd")
_REGISTRY_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry"'
    ' xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
)


def libreoffice_items(main_xcd: Path = LIBREOFFICE_MAIN_XCD) -> tuple[str, ...]:
    """:data:`LIBREOFFICE_ITEMS` plus ``ooSetupLastVersion`` = the installed version read from
    ``main_xcd`` (omitted when LibreOffice is not installed or the file names no version)."""
    try:
        found = re.search(
            r'oor:name="ooSetupVersion">\s*<value>([^<]+)</value>', main_xcd.read_text()
        )
    except OSError:
        found = None
    if found is None:
        return LIBREOFFICE_ITEMS
    version = (
        '<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="ooSetupLastVersion"'
        f' oor:op="fuse"><value>{found.group(1)}</value></prop></item>'
    )
    return (*LIBREOFFICE_ITEMS, version)


def add_libreoffice_settings(home: Path, *, create: bool = False) -> None:
    """Write :func:`libreoffice_items` into the profile's ``registrymodifications.xcu``, keeping
    what it holds; ``create``: start the file when there is none.

    Raises ``FileNotFoundError`` when the profile has not been built and ``create`` is false.
    """
    registry = home / LIBREOFFICE_REGISTRY
    if create and not registry.exists():
        registry.parent.mkdir(parents=True, exist_ok=True)
        registry.write_text(_REGISTRY_HEAD + "</oor:items>\n")
    text = registry.read_text()
    missing = "".join(item for item in libreoffice_items() if item not in text)
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
