"""Windows named as on OSWorld's VM: the window classes and titles OSWorld's configs look for.

OSWorld's setup and postconfig steps find windows by name (``activate_window`` /
``close_window`` with ``window_name``, ``strict``, ``by_class``: ``wmctrl -a/-c``, ``-F`` for
strict, ``-x`` for by class, where the class is ``instance.class`` of ``WM_CLASS``). A step that
finds no window does nothing and says nothing (OSWorld's server answers 200 either way), so a
difference in names between Debian's apps and the VM's is a silent grading fault:

- **Thunderbird's class.** Debian's Thunderbird names its main window's class
  ``Mail.thunderbird-default`` (its remoting name carries the update channel); the VM's is
  ``Mail.thunderbird``. Six thunderbird configs close ``Mail.thunderbird`` (strict, by class)
  before grading, so that Thunderbird exits and writes its state (``xulstore.json`` is written
  30 s after a change or at exit): with no window found, a solved task scored 0. Every sandbox's
  seed layer holds ``/usr/bin/thunderbird`` that runs Debian's own wrapper (copied to
  :data:`THUNDERBIRD_DEBIAN_WRAPPER`) with ``--class=thunderbird``, which makes the class
  ``Mail.thunderbird`` (measured: Thunderbird 153 on Xvfb).
- **Chrome's title.** Chromium ends its window titles with ``- Chromium``, Google's build with
  ``- Google Chrome``; 28 configs activate ``Google Chrome`` (not strict). The product name is
  compiled into Chromium's resources, so the desktop's window search reads ``Google Chrome`` in a
  name as ``Chromium`` too (:func:`title_variants`).

:data:`LOCAL_WINDOWS` lists the titles and classes local desktops' apps give their windows
(measured on Debian 12 with the GTK 3 LibreOffice, docs/local-desktop.md §11);
:func:`window_name_problem` tells whether a config's window name can match one of them
(``tests/test_vm_window_names.py`` runs it over every OSWorld config in ``tests/data/osworld``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

THUNDERBIRD = "/usr/bin/thunderbird"
#: Where the seed layer keeps a copy of Debian's own ``/usr/bin/thunderbird`` (a bash wrapper
#: that passes its arguments on to ``/usr/lib/thunderbird/thunderbird``).
THUNDERBIRD_DEBIAN_WRAPPER = "usr/lib/legato/thunderbird-debian"
#: The class OSWorld's VM gives Thunderbird's windows (``Mail.thunderbird`` for its main window).
THUNDERBIRD_CLASS = "thunderbird"
THUNDERBIRD_WRAPPER = f"""#!/bin/sh
# Thunderbird on a legato local desktop: Debian's wrapper with the window class of OSWorld's VM
# (Mail.thunderbird; legato_pipelines/desktops/server/vm_windows.py).
exec /{THUNDERBIRD_DEBIAN_WRAPPER} --class={THUNDERBIRD_CLASS} "$@"
"""
#: VM window names -> the local desktop's: Chromium's titles end in "Chromium".
TITLE_ALIASES = {"Google Chrome": "Chromium"}


def write_seed(seed: Path) -> list[str]:
    """Lay ``/usr/bin/thunderbird`` with the VM's window class into a sandbox's seed directory,
    with a copy of Debian's wrapper beside it; nothing when Thunderbird is not installed or its
    launcher is not a script. Returns the paths written, relative to ``seed``. Raises
    ``OSError`` when ``seed`` cannot be written."""
    try:
        debian = Path(THUNDERBIRD).read_bytes()
    except OSError:
        return []
    if not debian.startswith(b"#!"):  # not Debian's wrapper: leave it alone
        return []
    written = []
    for rel, data in (
        (THUNDERBIRD_DEBIAN_WRAPPER, debian),
        (THUNDERBIRD.lstrip("/"), THUNDERBIRD_WRAPPER.encode()),
    ):
        path = seed / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755)
        written.append(rel)
    for directory in ("usr", "usr/bin", "usr/lib", "usr/lib/legato"):
        os.chmod(seed / directory, 0o755)
    return written


def title_variants(name: str) -> list[str]:
    """``name`` and the local spelling of the VM's app names in it (``Google Chrome`` ->
    ``Chromium``), for a window search by title."""
    variants = [name]
    for vm_name, local in TITLE_ALIASES.items():
        if vm_name in name:
            variants.append(name.replace(vm_name, local))
    return variants


@dataclass(frozen=True, slots=True)
class LocalWindow:
    """The windows of one app on a local desktop. ``titles``: title templates, ``{}``
    standing for free text (a file or page name); ``wm_class``: ``instance.class`` as wmctrl
    ``-x`` matches it."""

    app: str
    titles: tuple[str, ...]
    wm_class: str


#: What local desktops' apps name their windows (measured on Xvfb, Debian 12; LibreOffice with
#: its GTK 3 front end). Only the windows OSWorld's configs look for are listed.
LOCAL_WINDOWS: tuple[LocalWindow, ...] = (
    LocalWindow("libreoffice_calc", ("{} - LibreOffice Calc",), "libreoffice.libreoffice-calc"),
    LocalWindow(
        "libreoffice_writer", ("{} - LibreOffice Writer",), "libreoffice.libreoffice-writer"
    ),
    LocalWindow(
        "libreoffice_impress", ("{} - LibreOffice Impress",), "libreoffice.libreoffice-impress"
    ),
    # google-chrome (chrome.py) names its class as Google's build does; the instance carries
    # the profile folder, as Chrome's does for a --user-data-dir that is not its default
    LocalWindow(
        "chrome",
        ("{} - Chromium",),
        "google-chrome (/home/user/.config/google-chrome).Google-chrome",
    ),
    # "Message Filters": its filter list dialog (Tools > Message Filters), which two configs close
    LocalWindow(
        "thunderbird", ("{} - Mozilla Thunderbird", "Message Filters"), f"Mail.{THUNDERBIRD_CLASS}"
    ),
    LocalWindow("vlc", ("VLC media player", "{} - VLC media player"), "vlc.vlc"),
    LocalWindow("gimp", ("GNU Image Manipulation Program", "{} – GIMP"), "gimp.Gimp"),
    LocalWindow("terminal", ("Terminal",), "gnome-terminal-server.Gnome-terminal"),
    LocalWindow("pdf_viewer", ("Recent Documents", "{} — {}"), "evince.Evince"),
    LocalWindow("nautilus", ("Home",), "org.gnome.Nautilus.org.gnome.Nautilus"),
)


def _matches(name: str, template: str, strict: bool) -> bool:
    """Whether a window titled by ``template`` can match ``name`` as wmctrl does (strict: the
    whole title, case-sensitive; else a case-insensitive substring)."""
    whole = re.compile(
        ".+".join(re.escape(part) for part in template.split("{}")), 0 if strict else re.I
    )
    if whole.fullmatch(name):
        return True
    if strict:
        return False
    # a substring of the title's fixed text (a free part may hold anything: not evidence)
    return any(name.lower() in part.lower() for part in template.split("{}") if part.strip())


def window_name_problem(name: str, *, strict: bool = False, by_class: bool = False) -> str | None:
    """``None`` when a window of a local desktop's app can match ``window_name`` as OSWorld's
    ``activate_window``/``close_window`` step searches it (:meth:`.windows.Windows.find`), else
    why not (a short sentence naming the window)."""
    for variant in title_variants(name):
        for window in LOCAL_WINDOWS:
            if by_class:
                if (
                    (variant == window.wm_class)
                    if strict
                    else (variant.lower() in window.wm_class.lower())
                ):
                    return None
            elif any(_matches(variant, template, strict) for template in window.titles):
                return None
    kind = "class" if by_class else "title"
    return f"no app of a local desktop has a window whose {kind} matches {name!r}"
