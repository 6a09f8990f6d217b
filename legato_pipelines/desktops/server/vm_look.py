"""The VM's look on a local desktop (``--session vm``): a look-alike of OSWorld's Ubuntu 22.04
GNOME 42 session built from Debian packages, with openbox kept as the window manager.

- a top bar with a centred clock and a dock on the left showing the VM's favourites: two
  ``tint2`` panels, infrastructure processes like openbox (they survive a reset); their
  struts make openbox's work area the screen minus both, as GNOME's;
- the Yaru GTK theme and icons and the "Ubuntu" interface font in the desktop user's HOME
  (``gtk-3.0/settings.ini``, ``.gtkrc-2.0``, and the same keys in dconf,
  :data:`DCONF_SETTINGS`); fontconfig answers "Ubuntu" with Cantarell (``fonts-ubuntu`` is
  not in Debian);
- the root window painted in Ubuntu's background colour (:data:`WALLPAPER`);
- openbox opening the apps the VM opens maximized, maximized (:data:`MAXIMIZED_CLASSES`).

The dock follows the desktop user's ``org.gnome.shell favorite-apps`` in dconf, as GNOME
Shell's does (:mod:`.dock_favourites`): :func:`favourites` picks the names GNOME 42 would show,
:func:`panel_configs` writes the dock for them, and the server reloads it when the key changes.

A click on a dock icon opens that favourite as GNOME does (its desktop file's ``Exec``
without field codes, :func:`exec_argv`), inside the sandbox: the panels run on the host as
the server's user, outside the sandbox, and an app they started would be theirs
(infrastructure) and survive a reset; so an icon's ``Exec`` only names the favourite to the
desktop server (:mod:`.dock_channel`), which opens it as ``/setup/launch`` opens apps (the
desktop user, inside the sandbox, killed by the next reset). docs/local-desktop.md §18 lists
what matches the VM and what does not.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The desktop sessions a server can run: ``plain`` (openbox on black) or ``vm``.
SESSIONS = ("plain", "vm")
#: Ubuntu's background colour (``org.gnome.desktop.background primary-color`` on Ubuntu,
#: aubergine); the VM shows its Jammy Jellyfish picture over it.
WALLPAPER = "#2c001e"
#: Heights in pixels at 1920x1080 (GNOME 42's top bar and Ubuntu's dock).
TOP_BAR_PX = 32
DOCK_PX = 72
#: The dock's largest icon size, and its ``tint2`` paddings (``panel_padding``,
#: ``launcher_padding``: along the panel, across it, spacing): :func:`dock_icon_centre`.
DOCK_ICON_PX = 48
_DOCK_PANEL_PADDING = (8, 8, 8)
_DOCK_LAUNCHER_PADDING = (4, 8, 8)
#: The VM's dock favourites, in order, as desktop files: what OSWorld's screenshots of its VM
#: show (not read from the VM image's dconf): the baseline's ``favorite-apps``, which a reset
#: restores; the ones this host lacks (VS Code) are left out of the dock; ``google-chrome``
#: is Chromium's here.
FAVOURITES = (
    "google-chrome.desktop",
    "thunderbird.desktop",
    "code.desktop",
    "vlc.desktop",
    "libreoffice-writer.desktop",
    "libreoffice-calc.desktop",
    "libreoffice-impress.desktop",
    "gimp.desktop",
    "org.gnome.Nautilus.desktop",
)
#: Desktop files standing for a favourite on this host (Debian names).
_HOST_NAMES = {"google-chrome.desktop": ("google-chrome.desktop", "chromium.desktop")}
#: The dconf key the dock shows (schema, key): GNOME Shell's ``AppFavorites``.
FAVOURITES_KEY = ("org.gnome.shell", "favorite-apps")
#: Desktop file ids the dock looks up: a plain file name ending in ``.desktop`` (the names
#: come from the task's dconf and become host paths and tint2 config lines: no ``/``, no
#: leading dot, no space or control character), at most 255 bytes (a FIFO line,
#: :data:`.dock_channel.MAX_LINE`).
_DESKTOP_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@-]{0,246}\.desktop")
#: Terminals a ``Terminal=true`` entry runs in, in GLib's order (``gdesktopappinfo.c``,
#: ``prepend_terminal_to_vector``: gnome-terminal first, xterm last), with the flag before
#: the command.
_TERMINALS = (("gnome-terminal", "--"), ("xterm", "-e"))
APPLICATIONS = Path("/usr/share/applications")
#: WM_CLASS classes (openbox glob patterns) of the main windows the VM opens maximized:
#: GNOME maximizes a window that asks for nearly the whole work area, which these apps do
#: (LibreOffice, Chrome, GIMP, Thunderbird, VS Code); terminals, the file manager, VLC and
#: dialogs keep their size.
MAXIMIZED_CLASSES = (
    "libreoffice*",
    "Google-chrome",
    "Chromium",
    "Gimp*",
    "thunderbird*",
    "Code",
)
THEME, ICONS, FONT = "Yaru", "Yaru", "Ubuntu 11"
#: The same settings in dconf (schema, key, GVariant text), as ``gsettings get`` on the VM;
#: the dock's favourites too (``gnome-shell-common``'s schema).
DCONF_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("org.gnome.desktop.interface", "gtk-theme", f"'{THEME}'"),
    ("org.gnome.desktop.interface", "icon-theme", f"'{ICONS}'"),
    ("org.gnome.desktop.interface", "font-name", f"'{FONT}'"),
    ("org.gnome.desktop.interface", "clock-format", "'24h'"),
    ("org.gnome.desktop.background", "primary-color", f"'{WALLPAPER}'"),
    ("org.gnome.shell", "favorite-apps", repr(list(FAVOURITES))),
)
#: Debian packages the session needs (path -> package), checked by :func:`missing`.
REQUIRED_FILES = {
    "/usr/bin/tint2": "tint2",
    "/usr/share/themes/Yaru/gtk-3.0": "yaru-theme-gtk",
    "/usr/share/icons/Yaru/index.theme": "yaru-theme-icon",
    "/usr/share/fonts/opentype/cantarell": "fonts-cantarell",
}
#: fontconfig: "Ubuntu" is Cantarell (GNOME's own font, the closest Debian has).
FONTS_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig>
  <alias binding="same"><family>Ubuntu</family><prefer><family>Cantarell</family></prefer></alias>
</fontconfig>
"""

_PANEL_COMMON = """wm_menu = 0
panel_dock = 0
panel_layer = top
strut_policy = follow_size
panel_margin = 0 0
panel_background_id = 1
rounded = 0
border_width = 0
border_color = #000000 0
mouse_left = none
mouse_middle = none
mouse_right = none
mouse_scroll_up = none
mouse_scroll_down = none
"""


def missing() -> list[str]:
    """Debian packages ``--session vm`` needs that are not installed (empty: none)."""
    return list(dict.fromkeys(p for path, p in REQUIRED_FILES.items() if not os.path.exists(path)))


def check_session(name: str) -> str:
    """``name`` if it is a known session; raises ``ValueError`` naming the choices and, for
    ``vm``, the packages to install."""
    if name not in SESSIONS:
        raise ValueError(f"unknown desktop session {name!r}; choose one of {', '.join(SESSIONS)}")
    if name == "vm" and missing():
        raise ValueError(f"session 'vm' needs: apt-get install {' '.join(missing())}")
    return name


def openbox_applications() -> str:
    """The ``<application>`` rules of openbox's ``rc.xml`` maximizing the VM's maximized apps
    (main windows only: ``type="normal"``)."""
    rules = "".join(
        f'<application class="{cls}" type="normal"><maximized>yes</maximized></application>\n'
        for cls in MAXIMIZED_CLASSES
    )
    return rules


def write_home(home: Path, uid: int | None, gid: int | None) -> None:
    """Write the theme and font settings into ``home`` (the baseline HOME): GTK 3's
    ``settings.ini`` (read by GTK apps on X11 without a settings daemon), GTK 2's
    ``.gtkrc-2.0`` (GIMP 2.10) and the fontconfig alias. Files are owned by ``uid``/``gid``."""
    ini = configparser.ConfigParser()
    ini.optionxform = str
    ini["Settings"] = {
        "gtk-theme-name": THEME,
        "gtk-icon-theme-name": ICONS,
        "gtk-font-name": FONT,
    }
    files = {
        ".config/gtk-3.0/settings.ini": None,
        ".gtkrc-2.0": (
            f'gtk-theme-name="{THEME}"\ngtk-icon-theme-name="{ICONS}"\ngtk-font-name="{FONT}"\n'
        ),
        ".config/fontconfig/fonts.conf": FONTS_CONF,
    }
    for rel, text in files.items():
        path = home / rel
        for parent in reversed(path.relative_to(home).parents[:-1]):
            folder = home / parent
            if not folder.exists():
                folder.mkdir()
                if uid is not None:
                    os.chown(folder, uid, gid if gid is not None else uid)
        if text is None:
            with open(path, "w") as f:
                ini.write(f, space_around_delimiters=False)
        else:
            path.write_text(text)
        if uid is not None:
            os.chown(path, uid, gid if gid is not None else uid)


@dataclass(frozen=True)
class Favourite:
    """A favourite of the dock installed here: its desktop file ``name`` (the VM's, e.g.
    ``google-chrome.desktop``), the ``source`` file standing for it, its ``title`` and
    ``icon``, and the ``argv`` a click on it runs (:func:`exec_argv`)."""

    name: str
    source: Path
    title: str
    icon: str
    argv: tuple[str, ...]


def favourites(
    folders: Sequence[Path] = (APPLICATIONS,), names: Sequence[str] = FAVOURITES
) -> list[Favourite]:
    """The favourites ``names`` (desktop file ids, e.g. ``favorite-apps``' value) the dock
    shows here, in their order, as GNOME Shell 42's ``AppFavorites.reload`` picks them
    (js/ui/appFavorites.js): ids it cannot look up are left out, a repeated id counts once
    (at its first place), entries not to be shown (``NoDisplay``/``Hidden`` true: GLib's
    ``g_app_info_should_show``) are left out. Each is the first desktop file found under the
    favourite's own name, then under its Debian names (:data:`_HOST_NAMES`), in ``folders``
    in order: a sandboxed desktop passes its seed layer's ``usr/share/applications`` first,
    which the sandbox's ``/usr`` shows over the host's (its ``google-chrome.desktop`` runs the
    ``google-chrome`` wrapper, :mod:`.chrome`). Also left out: names that are no plain
    desktop file name (:data:`_DESKTOP_ID`) and files without a readable ``Exec``."""
    found: list[Favourite] = []
    for name in dict.fromkeys(names):
        if not isinstance(name, str) or not _DESKTOP_ID.fullmatch(name):
            continue
        candidates = (f / n for n in _HOST_NAMES.get(name, (name,)) for f in folders)
        source = next((p for p in candidates if p.is_file()), None)
        if source is None:
            continue
        original = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            original.read(source)
            entry = original["Desktop Entry"]
            if entry.getboolean("NoDisplay", False) or entry.getboolean("Hidden", False):
                continue
            title, icon = entry.get("Name", name), entry.get("Icon", "application-x-executable")
            argv = exec_argv(entry["Exec"], title=title, icon=icon, path=str(source))
            if argv and entry.getboolean("Terminal", False):
                argv = terminal_prefix() + argv
        except (configparser.Error, KeyError, ValueError):
            continue
        if argv:
            found.append(Favourite(name, source, title, icon, tuple(argv)))
    return found


def terminal_prefix() -> list[str]:
    """What a ``Terminal=true`` entry's command is put behind (GLib's choice,
    :data:`_TERMINALS`): ``["gnome-terminal", "--"]``, else ``["xterm", "-e"]``; raises
    ``ValueError`` when neither is installed (the favourite is then left out)."""
    for program, flag in _TERMINALS:
        if shutil.which(program):
            return [program, flag]
    raise ValueError("no terminal for a Terminal=true entry")


def parse_favourites(text: str) -> list[str] | None:
    """The string list ``gsettings get`` printed for ``favorite-apps`` (GVariant text:
    ``['a.desktop', 'b.desktop']``, ``@as []`` when empty), ``None`` when it is not one."""
    text = text.strip()
    if text.startswith("@as "):
        text = text[4:]
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


#: Field codes that stand for files or URLs (and the deprecated ones): a launch without files
#: drops them (the Desktop Entry Specification, "The Exec key").
_FILE_CODES = re.compile(r"%[fFuUdDnNvm]")


def exec_argv(exec_line: str, *, title: str, icon: str | None, path: str) -> list[str]:
    """The argv a desktop entry's ``Exec`` runs when launched without files, as GLib's
    ``GDesktopAppInfo`` (GNOME's) expands it: quoting as the specification's (double quotes,
    backslash escapes; read with :func:`shlex.split`), ``%f %F %u %U`` (and the deprecated
    ``%d %D %n %N %v %m``) dropped, ``%i`` -> ``--icon ICON`` (nothing without an icon),
    ``%c`` -> the name, ``%k`` -> the file's path, ``%%`` -> ``%``. Raises ``ValueError`` for
    unbalanced quotes."""
    argv: list[str] = []
    for word in shlex.split(exec_line):
        if word == "%i":
            argv += ["--icon", icon] if icon else []
            continue
        if word in ("%c", "%k"):
            argv.append(title if word == "%c" else path)
            continue
        parts = word.split("%%")
        parts = [_FILE_CODES.sub("", p).replace("%c", title).replace("%k", path) for p in parts]
        expanded = "%".join(parts)
        if expanded or not _FILE_CODES.fullmatch(word):
            argv.append(expanded)
    return argv


def dock_entries(
    folder: Path, found: Sequence[Favourite], launch: Callable[[str], str]
) -> list[Path]:
    """Desktop files of the dock in ``folder`` (created; the entries of an earlier dock
    removed): one per favourite of ``found``, in order, with its title and icon and ``Exec``
    ``launch(name)`` (a shell command handing the launch to the desktop server:
    :meth:`.dock_channel.DockChannel.exec_line`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.desktop"):
        old.unlink()
    entries = []
    for index, fav in enumerate(found):
        path = folder / f"{index:02d}-{fav.name}"
        path.write_text(
            f"[Desktop Entry]\nType=Application\nName={fav.title}\nIcon={fav.icon}\n"
            f"Exec={launch(fav.name)}\n"
        )
        entries.append(path)
    return entries


def dock_icon_centre(index: int) -> tuple[int, int]:
    """Pixel ``(x, y)`` at the centre of the ``index``-th icon of the dock (0: the top one),
    from the dock's ``tint2`` layout: in a vertical panel the first padding value runs along
    the panel and the second across it; an icon is as large as the panel's width leaves
    (:data:`DOCK_PX` minus twice both across-paddings, at most :data:`DOCK_ICON_PX`). The
    dock starts below the top bar, as Ubuntu's does (its tint2 ``panel_margin``)."""
    along, across, _ = _DOCK_PANEL_PADDING
    l_along, l_across, l_spacing = _DOCK_LAUNCHER_PADDING
    size = min(DOCK_ICON_PX, DOCK_PX - 2 * across - 2 * l_across)
    x = across + l_across + size // 2
    y = TOP_BAR_PX + along + l_along + index * (size + l_spacing) + size // 2
    return x, y


def panel_configs(
    folder: Path, found: Sequence[Favourite], launch: Callable[[str], str]
) -> list[Path]:
    """``tint2`` configurations of the top bar (centred clock) and the dock (the icons of the
    favourites ``found``, a click running ``launch(name)``: :func:`dock_entries`), written
    into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    top = folder / "top-bar.tint2rc"
    top.write_text(
        _PANEL_COMMON
        + f"""panel_items = FCF
panel_size = 100% {TOP_BAR_PX}
panel_padding = 8 0 8
panel_position = top center horizontal
background_color = #000000 100
time1_format = %b %e  %H:%M
time1_font = Ubuntu Bold 11
clock_font_color = #ffffff 100
clock_padding = 0 0
clock_background_id = 0
"""
    )
    items = "".join(
        f"launcher_item_app = {p}\n"
        for p in dock_entries(folder / "dock-applications", found, launch)
    )
    dock = folder / "dock.tint2rc"
    dock.write_text(
        _PANEL_COMMON
        + f"""panel_items = L
panel_size = 100% {DOCK_PX}
panel_padding = {" ".join(map(str, _DOCK_PANEL_PADDING))}
panel_position = top left vertical
panel_margin = 0 {TOP_BAR_PX}
background_color = #1d1d1d 100
launcher_padding = {" ".join(map(str, _DOCK_LAUNCHER_PADDING))}
launcher_background_id = 0
launcher_icon_size = {DOCK_ICON_PX}
launcher_icon_theme = {ICONS}
launcher_icon_theme_override = 1
launcher_tooltip = 0
{items}"""
    )
    return [top, dock]


def paint_root(display, colour: str = WALLPAPER) -> None:
    """Paint the root window of ``display`` (an open python-xlib ``Display``) in ``colour``
    (``#rrggbb``), as ``xsetroot -solid`` does."""
    screen = display.screen()
    red, green, blue = (int(colour[i : i + 2], 16) * 257 for i in (1, 3, 5))
    pixel = screen.default_colormap.alloc_color(red, green, blue).pixel
    screen.root.change_attributes(background_pixel=pixel)
    screen.root.clear_area(0, 0, 0, 0)
    display.sync()
