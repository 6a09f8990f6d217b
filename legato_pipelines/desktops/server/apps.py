"""How the desktop starts apps: command parsing (OSWorld semantics), dbus wrapping, openers.

OSWorld's server splits a command string without ``shell`` with shlex and expands a leading
``~/`` in each argument; the local server does the same with the desktop user's HOME.
A desktop with a session bus of its own (:mod:`.dbus_session`, the default where Debian's
dbus-daemon and dconf are installed) starts apps on that bus. Without one, apps that autolaunch
a session bus (mousepad, nautilus, LibreOffice, ...) are wrapped in ``dbus-run-session --`` so
the bus is their child and dies with them instead of leaking (docs/local-desktop.md §9).
``/setup/open_file`` picks an app by extension (there is no desktop environment to ask),
falling back to ``xdg-open`` when installed, which in a sandbox opens the default app of
OSWorld's VM (:mod:`.mime_defaults`: a PDF in evince).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from ..domains import TEXT_EDITORS
from . import chrome, dbus_session

#: Programs wrapped in ``dbus-run-session``.
DBUS_APPS = frozenset(
    {
        "mousepad",
        "gedit",
        "nautilus",
        "thunderbird",
        "code",
        "gimp",
        "vlc",
        "totem",
        "evince",
        "eog",
        "google-chrome",
        "chromium",
        "libreoffice",
        "soffice",
        "gnome-terminal",
        "xdg-open",
    }
)
TEXT_EXTS = frozenset(
    {
        ".txt",
        ".md",
        ".py",
        ".json",
        ".log",
        ".ini",
        ".cfg",
        ".conf",
        ".sh",
        ".xml",
        ".yaml",
        ".yml",
        ".html",
        ".css",
        ".js",
        ".c",
        ".h",
        ".tex",
        ".srt",
    }
)
OFFICE_EXTS = {
    **dict.fromkeys((".xlsx", ".xls", ".ods", ".csv"), "--calc"),
    **dict.fromkeys((".docx", ".doc", ".odt", ".rtf"), "--writer"),
    **dict.fromkeys((".pptx", ".ppt", ".odp"), "--impress"),
}
OSWORLD_HOME = "/home/user"  # the HOME of OSWorld's VM user


def expand_home(arg: str, home: str) -> str:
    """``~`` and ``~/x`` -> the desktop HOME (other arguments unchanged)."""
    if arg == "~":
        return home
    if arg.startswith("~/"):
        return home + arg[1:]
    return arg


def resolve_path(path: str, home: str) -> str:
    """A path as the desktop user means it: ``~`` expanded, relative to HOME (OSWorld's server
    runs in ``/home/user``), and OSWorld's ``/home/user/...`` mapped into the desktop's HOME
    (the path fields of OSWorld task configs hard-code the VM user's HOME)."""
    path = expand_home(path, home)
    if path == OSWORLD_HOME or path.startswith(OSWORLD_HOME + "/"):
        path = home + path[len(OSWORLD_HOME) :]
    return path if os.path.isabs(path) else os.path.join(home, path)


def command_argv(command: list[str] | str, shell: bool, home: str) -> list[str] | str:
    """The argv (or shell string) to run, as OSWorld's ``/execute`` builds it.

    Raises ``ValueError`` for an empty command or a wrong type.
    """
    if isinstance(command, str):
        if shell:
            if not command.strip():
                raise ValueError("field 'command' is empty")
            return command
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError("field 'command' must be a non-empty string or list of strings")
    return [expand_home(a, home) for a in command]


def with_session_bus(
    argv: list[str] | str, shell: bool, *, desktop_bus: bool = False
) -> tuple[list[str] | str, bool]:
    """Wrap a launch in ``dbus-run-session --`` when it starts a bus-autolaunching app.

    ``desktop_bus``: the desktop has a session bus of its own (:mod:`.dbus_session`), which the
    app must share (gsettings, gnome-terminal-server); nothing is wrapped then.
    """
    if desktop_bus:
        return argv, shell
    words = shlex.split(argv) if isinstance(argv, str) else argv
    programs = {os.path.basename(w) for w in words}
    if not programs & DBUS_APPS or not shutil.which("dbus-run-session"):
        return argv, shell
    if shell or isinstance(argv, str):
        return [
            "dbus-run-session",
            "--",
            "sh",
            "-c",
            argv if isinstance(argv, str) else shlex.join(argv),
        ], False
    return ["dbus-run-session", "--", *argv], False


def opener_for(path: str) -> list[str]:
    """The command that opens ``path``: LibreOffice for office files, a text editor for text,
    else ``xdg-open``. Raises ``ValueError`` when no installed app can open it."""
    ext = os.path.splitext(path)[1].lower()
    if ext in OFFICE_EXTS and shutil.which("libreoffice"):
        return ["libreoffice", OFFICE_EXTS[ext], path]
    if ext in TEXT_EXTS or ext == "":
        for editor in TEXT_EDITORS:
            if shutil.which(editor):
                return [editor, path]
    if shutil.which("xdg-open"):
        return ["xdg-open", path]
    raise ValueError(
        f"no installed app opens {ext or 'extensionless'} files (install libreoffice, l3afpad or xdg-utils)"
    )


@dataclass(frozen=True, slots=True)
class DesktopApp:
    """An app a local desktop can have, from Debian.

    ``provides``: the app name tasks use (``legato tasks check``'s ``apps``: ``terminal``,
    ``libreoffice_writer``, ``gimp``, ...); ``command``: the argv of a launch step;
    ``needs``: programs on ``PATH`` or absolute paths that must exist; ``packages``: the
    Debian packages that bring it (scripts/setup.sh installs them); ``title``: a
    case-insensitive part of its main window's title.
    """

    provides: str
    command: tuple[str, ...]
    needs: tuple[str, ...]
    packages: str
    title: str

    def installed(self) -> bool:
        """True when everything in :attr:`needs` is on this host."""
        return all(
            os.path.exists(need) if need.startswith("/") else shutil.which(need) is not None
            for need in self.needs
        )


LO_PROGRAM = "/usr/lib/libreoffice/program"
#: The apps of local desktops (docs/local-desktop.md §1, §11). ``google-chrome`` exists inside
#: sandboxed desktops only (:mod:`.chrome`).
DESKTOP_APPS: tuple[DesktopApp, ...] = (
    DesktopApp("terminal", ("xterm",), ("xterm",), "xterm", "xterm"),
    DesktopApp("terminal", ("gnome-terminal",), ("gnome-terminal",), "gnome-terminal", "Terminal"),
    DesktopApp("text_editor", ("l3afpad",), ("l3afpad",), "l3afpad", "Untitled"),
    DesktopApp(
        "libreoffice_calc",
        ("libreoffice", "--calc"),
        ("soffice", f"{LO_PROGRAM}/libsclo.so"),
        "libreoffice-calc",
        "LibreOffice Calc",
    ),
    DesktopApp(
        "libreoffice_writer",
        ("libreoffice", "--writer"),
        ("soffice", f"{LO_PROGRAM}/libswlo.so"),
        "libreoffice-writer",
        "LibreOffice Writer",
    ),
    DesktopApp(
        "libreoffice_impress",
        ("libreoffice", "--impress"),
        ("soffice", f"{LO_PROGRAM}/libslideshowlo.so"),
        "libreoffice-impress",
        "LibreOffice Impress",
    ),
    DesktopApp("gimp", ("gimp",), ("gimp",), "gimp", "GNU Image Manipulation Program"),
    DesktopApp("vlc", ("vlc",), ("vlc",), "vlc", "VLC media player"),
    DesktopApp("thunderbird", ("thunderbird",), ("thunderbird",), "thunderbird", "Thunderbird"),
    DesktopApp("nautilus", ("nautilus",), ("nautilus",), "nautilus", "Home"),
    # GNOME's Document Viewer, the PDF viewer of OSWorld's Ubuntu VM (related_apps "pdf"); with
    # no file it opens its "Recent Documents" window
    DesktopApp("pdf_viewer", ("evince",), ("evince",), "evince", "Recent Documents"),
    # GNOME's Videos: not a task app, but the default video player of OSWorld's VM
    # (:mod:`.mime_defaults`), which task 937087b6 asks to change to VLC
    DesktopApp("totem", ("totem",), ("totem",), "totem", "Videos"),
    DesktopApp("picard", ("picard",), ("picard",), "picard", "MusicBrainz Picard"),
    DesktopApp(
        "chrome",
        ("google-chrome", f"--remote-debugging-port={chrome.CDP_PORT}"),
        (chrome.CHROMIUM_BINARY,),
        "chromium",
        "Chromium",
    ),
)


#: Programs whose launch opens a main window: the reset's ready wait waits for it
#: (:meth:`~.server_state.DesktopServer.wait_ready`). Other launches (a script, a server) are
#: not waited for.
WINDOWED_PROGRAMS = frozenset(app.command[0] for app in DESKTOP_APPS) | {
    "soffice",
    "chromium",
    "gimp-2.10",
    "google-chrome-stable",  # what the VM's google-chrome.desktop runs (the dock, vm_look.py)
}


#: Windowed programs whose main window is up well under a second after the launch (a terminal,
#: the text editor, the file manager, the PDF viewer: ~0.1-0.4 s on 2 cores). ``/setup/launch``
#: answers once a new main window is managed (:data:`~.server_state.LAUNCH_WINDOW_S` at most):
#: OSWorld's setups poll for it with ``wmctrl -l`` and sleep 0.3 s between polls
#: (``SetupController._execute_setup``'s ``until``), which a launch answered while the window
#: was still being mapped paid once in three launches (issue 18). Heavy apps (LibreOffice,
#: Chrome, GIMP, ...) answer at once: their setups go on meanwhile (BENCHMARKS.md, issue 18 part 9).
QUICK_WINDOWED_PROGRAMS = frozenset({"xterm", "gnome-terminal", "l3afpad", "nautilus", "evince"})


def program_of(argv: list[str] | str) -> str:
    """The program a launch runs: the basename of its first word (``""`` when it has none or
    a shell string does not parse)."""
    try:
        words = shlex.split(argv) if isinstance(argv, str) else argv
    except ValueError:
        return ""
    return os.path.basename(words[0]) if words else ""


def terminal_command() -> list[str] | None:
    """What Ctrl+Alt+T opens (:mod:`.hotkeys`): gnome-terminal, GNOME's terminal on OSWorld's
    VM, else xterm; ``None`` when neither is installed."""
    for app in DESKTOP_APPS:
        if app.provides == "terminal" and app.command[0] == "gnome-terminal" and app.installed():
            return list(app.command)
    for app in DESKTOP_APPS:
        if app.provides == "terminal" and app.installed():
            return list(app.command)
    return None


def installed_apps() -> frozenset[str]:
    """The app names (as :attr:`DesktopApp.provides`) local desktops on this host have.

    Besides :data:`DESKTOP_APPS`: ``libreoffice`` with ``soffice``; ``os`` (OSWorld's GNOME
    session: persistent gsettings, gnome-terminal and nautilus) when the session bus with dconf
    (:mod:`.dbus_session`) and both apps are there. Looks at files only: no process starts.
    """
    names = {app.provides for app in DESKTOP_APPS if app.installed()}
    if shutil.which("soffice"):
        names.add("libreoffice")
    if not dbus_session.missing() and {"nautilus"} <= names and shutil.which("gnome-terminal"):
        names.add("os")
    return frozenset(names)


def desktop_python_has_pyautogui(timeout: float = 20.0) -> bool:
    """True when the ``python`` on the desktops' PATH imports pyautogui's parts, as OSWorld's
    in-VM commands (``python -c "import pyautogui; ..."``) need (``scripts/osworld_venv.sh``
    installs it). Runs that ``python`` once, for at most ``timeout`` seconds."""
    probe = (
        "import importlib.util, Xlib, pymsgbox, pytweening;"
        "assert importlib.util.find_spec('pyautogui')"
    )
    try:
        done = subprocess.run(
            ["python", "-c", probe],
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
            capture_output=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
