"""Chromium answering as ``google-chrome`` inside a sandboxed desktop, as OSWorld's configs expect.

OSWorld's chrome tasks (and many multi_apps tasks) launch ``["google-chrome",
"--remote-debugging-port=1337"]``, bridge it with ``socat tcp-listen:9222,fork
tcp:localhost:1337``, read the profile under ``~/.config/google-chrome`` and stop it with
``pkill chrome``. Google's build is not in Debian; Debian's ``chromium`` is, so every sandbox
gets, in the seed layer under its ``/usr`` overlay (docs/sandbox.md §2):

- ``/usr/bin/google-chrome`` and ``/usr/bin/google-chrome-stable``: a wrapper that runs
  Chromium with the profile in ``~/.config/google-chrome``, no first-run window, no default-
  browser check, passwords in the profile (no keyring), no background downloads (component
  updates, variations), no Local Network Access checks (:data:`DISABLED_FEATURES`), and
  ``--remote-debugging-port=1337`` unless the caller passes its own;
- ``/usr/lib/chromium/chrome``: Chromium's binary bind-mounted under that name (the mount point
  is an empty file of the seed layer), which the wrapper executes, so the browser's processes
  are named ``chrome`` and ``pkill chrome`` stops it as in OSWorld's VM. Chromium names its
  processes after ``/proc/self/exe`` (``prctl(PR_SET_NAME)``), so neither a symlink nor
  ``exec -a`` would do: ``chromium`` does not match ``pkill chrome``;
- ``/usr/share/applications/google-chrome.desktop``, which one config copies and edits;
- ``/usr/local/bin/socat`` (ahead of ``/usr/bin`` on the desktop's ``PATH``): socat with
  ``reuseaddr`` added to every ``tcp-listen`` address that lacks it (:data:`SOCAT_WRAPPER`).
  The bridge of one task leaves its closed connections on port 9222 in ``TIME_WAIT`` for 60 s
  when socat closed them first; a VM starts every task from a snapshot, but a local desktop
  keeps its network stack, so the next task's ``socat tcp-listen:9222`` failed with "Address
  already in use" (seen in a test run: task 99146c54 after 3f05f3b9). With ``reuseaddr`` the
  bind ignores ``TIME_WAIT`` and still fails while another socket listens there.

Nothing of the host changes: the files exist only inside the desktops' sandboxes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

#: Debian's Chromium binary (package ``chromium``) and its launcher.
CHROMIUM_BINARY = "/usr/lib/chromium/chromium"
CHROMIUM_LAUNCHER = "/usr/bin/chromium"
#: OSWorld's Chrome DevTools port inside the VM (docs/osworld.md §2).
CDP_PORT = 1337
#: The port OSWorld's configs bridge to it (``socat tcp-listen:9222,fork tcp:localhost:1337``),
#: which its getters reach as the VM's ``chromium_port``.
CDP_BRIDGE_PORT = 9222
#: Where Chromium's binary is bind-mounted inside a sandbox: its name becomes the process name.
CHROME_BINARY = "usr/lib/chromium/chrome"

#: Chromium features the wrapper turns off, so a profile holds what the Google Chrome of
#: OSWorld's VM (older than Local Network Access) writes: with ``LocalNetworkAccessChecks`` on,
#: Chromium writes ``profile.default_content_setting_values.has_migrated_local_network_access``
#: into every profile at its first start, and OSWorld's getter ``data_delete_automacally``
#: answers "true" (data deleted on exit: task 99146c54 done) as soon as that dictionary exists.
DISABLED_FEATURES = "LocalNetworkAccessChecks"

WRAPPER = f"""#!/bin/sh
# google-chrome on a legato local desktop: Debian's Chromium with OSWorld's profile folder and
# DevTools port (legato_pipelines/desktops/server/chrome.py). Flags given later win.
export CHROME_WRAPPER=/usr/bin/google-chrome CHROME_DESKTOP=google-chrome.desktop
exec /{CHROME_BINARY} \\
  --user-data-dir="$HOME/.config/google-chrome" \\
  --no-first-run --no-default-browser-check --password-store=basic \\
  --disable-background-networking --disable-component-update --disable-breakpad \\
  --disable-features={DISABLED_FEATURES} \\
  --remote-debugging-port={CDP_PORT} {{flags}}"$@"
"""

SOCAT = "/usr/bin/socat"
SOCAT_WRAPPER = f"""#!/bin/sh
# socat on a legato local desktop: tcp-listen addresses get reuseaddr, so a task's bridge binds
# while the previous task's closed connections wait in TIME_WAIT
# (legato_pipelines/desktops/server/chrome.py).
for arg do
  shift
  case "$arg" in
    [Tt][Cc][Pp]-[Ll][Ii][Ss][Tt][Ee][Nn]:*|[Tt][Cc][Pp][46]-[Ll][Ii][Ss][Tt][Ee][Nn]:*)
      case "$arg" in *[Rr][Ee][Uu][Ss][Ee][Aa][Dd][Dd][Rr]*) ;; *) arg="$arg,reuseaddr" ;; esac ;;
  esac
  set -- "$@" "$arg"
done
exec {SOCAT} "$@"
"""

DESKTOP_ENTRY = """[Desktop Entry]
Version=1.0
Name=Google Chrome
GenericName=Web Browser
Exec=/usr/bin/google-chrome-stable %U
StartupNotify=true
Terminal=false
Icon=chromium
Type=Application
Categories=Network;WebBrowser;
MimeType=text/html;text/xml;application/xhtml+xml;x-scheme-handler/http;x-scheme-handler/https;
StartupWMClass=Google-chrome
"""


def available() -> bool:
    """True when Debian's Chromium is installed (``apt-get install chromium``)."""
    return os.access(CHROMIUM_BINARY, os.X_OK)


def wrapper_script(flags: Sequence[str] = ()) -> str:
    """The ``google-chrome`` wrapper script, with ``flags`` (e.g. ``--proxy-server=...``:
    ``desktops/web.py``) after the built-in ones and before the caller's."""
    return WRAPPER.replace("{flags}", "".join(f"{shlex.quote(f)} " for f in flags))


def write_seed(seed: Path, flags: Sequence[str] = ()) -> list[str]:
    """Lay the ``google-chrome`` files into a sandbox's seed directory (``seed/usr/...``);
    the wrapper adds ``flags`` to every start (:func:`wrapper_script`).

    The socat wrapper is laid whenever socat is installed; the rest does nothing when Chromium
    is not installed. Returns the paths written, relative to ``seed``. Existing files are
    replaced. Raises ``OSError`` when the seed directory cannot be written.
    """
    written = []
    if os.access(SOCAT, os.X_OK):
        wrapper = seed / "usr/local/bin/socat"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(SOCAT_WRAPPER)
        os.chmod(wrapper, 0o755)
        for directory in ("usr", "usr/local", "usr/local/bin"):
            os.chmod(seed / directory, 0o755)
        written.append("usr/local/bin/socat")
    if not available():
        return written
    for rel, text, mode in (
        ("usr/bin/google-chrome", wrapper_script(flags), 0o755),
        ("usr/share/applications/google-chrome.desktop", DESKTOP_ENTRY, 0o644),
    ):
        path = seed / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)
        written.append(rel)
    link = seed / "usr/bin/google-chrome-stable"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to("google-chrome")
    mount_point = seed / CHROME_BINARY
    mount_point.parent.mkdir(parents=True, exist_ok=True)
    mount_point.touch()
    os.chmod(mount_point, 0o755)
    written += ["usr/bin/google-chrome-stable", CHROME_BINARY]
    for directory in (
        "usr",
        "usr/bin",
        "usr/lib",
        "usr/lib/chromium",
        "usr/share",
        "usr/share/applications",
    ):
        os.chmod(seed / directory, 0o755)
    return written


def bind_mounts(seed: Path) -> list[tuple[str, str]]:
    """``(host file, path inside the sandbox without the leading /)`` pairs to bind-mount when a
    sandbox starts: Chromium's binary onto :data:`CHROME_BINARY`, once :func:`write_seed` laid
    its mount point into ``seed``; else none."""
    if available() and (seed / CHROME_BINARY).is_file():
        return [(CHROMIUM_BINARY, CHROME_BINARY)]
    return []
