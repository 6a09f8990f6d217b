"""Build the solved OSWorld task list: ``tasks.json`` and the scripted policy's ``scripts/solve.json``.

Run ``python examples/tasks/osworld_solved/build.py`` after editing; the JSON files are committed.

Real OSWorld tasks (their configs in ``tests/data/osworld``, resolved with ``--osworld
tests/data/osworld``) that a scripted policy solves on local desktops with policy actions only:
keystrokes, typing, menus, a few clicks at fixed pixels of a 1280x720 screen, commands typed
into a terminal. Every entry references OSWorld's config unchanged: setup and evaluator are
OSWorld's, and nothing in the setup solves a task. ``scripts/solve.json`` is in the scripted
policy server's format ``{"tasks": {"<instruction>": ["<Qwen computer-use response>", ...]}}``;
the files the tasks download and compare against are built by ``files.py`` (openpyxl,
python-docx, python-pptx).

The ``os`` tasks set up no terminal: on OSWorld's VM (a GNOME session) the agent opens one
with Ctrl+Alt+T, and so do these scripts, as their first action (local desktops open
gnome-terminal on that key like GNOME: docs/local-desktop.md). The GIMP and VLC tasks' setups
launch the app; the desktops' reset wait waits for its main window.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
OSWORLD = REPO / "tests" / "data" / "osworld"

_spec = importlib.util.spec_from_file_location(
    "local_suite_build", HERE.parent / "local" / "build.py"
)
_local = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_local)
done, key, type_ = _local.done, _local.key, _local.type_
qwen_response = _local.qwen_response

SCREEN = (1280, 720)  # collect's default --screen; the clicks below are at these pixels


def click(x: int, y: int, what: str) -> str:
    """A left click at screen pixel ``(x, y)`` of a :data:`SCREEN`-sized desktop, sent on
    Qwen3-VL's 0..999 grid (OSWorld maps it back with ``x * W / 999``)."""
    grid = [round(x * 999 / SCREEN[0]), round(y * 999 / SCREEN[1])]
    return qwen_response(what, {"action": "left_click", "coordinate": grid})


#: GIMP's main window is up when the reset's wait ends, but it keeps loading for a moment on
#: loaded cores before it takes keys.
WAIT = qwen_response("Wait for GIMP to finish starting.", {"action": "wait", "time": 3})

#: VLC's preferences dialog draws its pages lazily; on loaded cores the first click can land
#: before the page is there, so the scripts wait a second before clicking in it.
VLC_PREFS = [
    key("ctrl", "p", what="Open VLC's Simple Preferences (Tools > Preferences)."),
    qwen_response("Wait for the preferences dialog.", {"action": "wait", "time": 1}),
]
VLC_SAVE = click(904, 698, "Save the preferences.")

SAVE_KEEP = [
    key("ctrl", "s", what="Save the document with Ctrl+S."),
    key("enter", what="Keep the current format in the dialog."),
]


def shell(*commands: str) -> list[str]:
    """Type each command into the open terminal, then report success."""
    return [type_(f"{command}\n") for command in commands] + [done()]


#: How the agent gets a terminal on OSWorld's GNOME VM (the ``os`` tasks open none).
OPEN_TERMINAL = key("ctrl", "alt", "t", what="Open a terminal with Ctrl+Alt+T.")


def terminal(*commands: str) -> list[str]:
    """Open a terminal (:data:`OPEN_TERMINAL`), then :func:`shell`."""
    return [OPEN_TERMINAL, *shell(*commands)]


#: (domain, task id, app, the script's responses)
SOLVED: list[tuple[str, str, str, list[str]]] = [
    # --- os: gsettings and files, typed into gnome-terminal ---
    (
        "os",
        "a4d98375-215b-4a4d-aee9-3d4370fccc41",
        "terminal",
        terminal("gsettings set org.gnome.desktop.screensaver lock-enabled true"),
    ),
    (
        "os",
        "bedcedc4-4d72-425e-ad62-21960b11fe0d",
        "terminal",
        terminal("gsettings set org.gnome.desktop.session idle-delay 0"),
    ),
    (
        "os",
        "ec4e3f68-9ea4-4c18-a5c9-69f89d1178b3",
        "terminal",
        terminal(
            "gsettings set org.gnome.shell favorite-apps \"['thunderbird.desktop', 'google-chrome.desktop']\""
        ),
    ),
    (
        "os",
        "f9be0997-4b7c-45c5-b05c-4612b44a6118",
        "terminal",
        terminal("gsettings set org.gnome.desktop.notifications show-banners false"),
    ),
    (
        "os",
        "3ce045a0-877b-42aa-8d2c-b4a863336ab8",
        "terminal",
        terminal("gsettings set org.gnome.desktop.interface text-scaling-factor 1.25"),
    ),
    (
        "os",
        "e0df059f-28a6-4169-924f-b9623e7184cc",
        "terminal",
        terminal("mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"),
    ),
    # --- LibreOffice Writer: the document is open; keyboard and menus ---
    (
        "libreoffice_writer",
        "3ef2b351-8a84-4ff2-8724-d86eae9b842e",
        "writer",
        [
            key("ctrl", "home", what="Go to the heading."),
            key("ctrl", "e", what="Centre it."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "ecc2413d-8a48-416e-a3a2-d30106ca36cb",
        "writer",
        [
            key("ctrl", "end", what="Go to the end of the document."),
            key("ctrl", "enter", what="Insert a page break."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "0e763496-b6bb-4508-a427-fad0b6c3e195",
        "writer",
        [
            key("ctrl", "a", what="Select all text."),
            click(300, 79, "Click the font name box."),
            key("ctrl", "a", what="Select its text."),
            type_("Times New Roman\n", "Set the font family."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "d53ff5ee-3b1a-431e-b2be-30ed2673079b",
        "writer",
        [
            key("ctrl", "a", what="Select all text."),
            key("alt", "o", what="Open the Format menu."),
            key("x", what="Text"),
            key("l", what="lowercase"),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "e528b65e-1107-4b8c-8988-490e4fece599",
        "writer",
        [
            key("ctrl", "a", what="Select all text."),
            key("alt", "o", what="Open the Format menu."),
            key("x", what="Text"),
            key("c", what="Capitalize Every Word"),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "0b17a146-2934-46c7-8727-73ff6b6483e8",
        "writer",
        [
            key("ctrl", "home", what="Go to the start of the heading, H2O."),
            key("right", what="Past the H."),
            key("shift", "right", what="Select the 2."),
            key("ctrl", "shift", "b", what="Subscript (Format > Text > Subscript)."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    # --- LibreOffice Calc ---
    (
        "libreoffice_calc",
        "7efeb4b1-3d19-4762-b163-63328d66303b",
        "calc",
        [
            key("ctrl", "home", what="Go to A1, the Seq No. header."),
            key("down", what="First data row."),
            type_("".join(f"No. {i}\n" for i in range(1, 8)), "Fill Seq No."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    # --- GIMP and VLC: their setting, by the app's own shortcut ---
    (
        "gimp",
        "d52d6308-ec58-42b7-a2c9-de80e4837b2b",
        "gimp",
        [WAIT, key("tab", what="Hide the docks (Windows > Hide Docks, Tab)."), done()],
    ),
    (
        "vlc",
        "a5bbbcd5-b398-4c91-83d4-55e1e31bbb81",
        "vlc",
        [*VLC_PREFS, click(418, 313, "Tick Start in minimal view mode."), VLC_SAVE, done()],
    ),
    (
        "vlc",
        "f3977615-2b45-4ac5-8bba-80c17dbe2a37",
        "vlc",
        [
            *VLC_PREFS,
            click(280, 537, "Untick Use only one instance when started from file manager."),
            VLC_SAVE,
            done(),
        ],
    ),
    (
        "vlc",
        "8ba5ae7a-5ae5-4eab-9fcc-5dd4fe3abf89",
        "vlc",
        [
            *VLC_PREFS,
            click(686, 65, "Open the Input / Codecs page."),
            click(717, 522, "Click the Record directory or filename field."),
            type_("/home/user/Desktop", "Type the Desktop folder."),
            VLC_SAVE,
            done(),
        ],
    ),
    (
        "libreoffice_calc",
        "51b11269-2ca8-4b2a-9163-f21758420e78",
        "calc",
        [
            key("ctrl", "home"),
            key("right", what="Go to B1, the Amount header."),
            key("alt", "d", what="Open the Data menu."),
            key("a", what="Sort Ascending."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_calc",
        "4188d3a4-077d-46b7-9c86-23e1a036f6c1",
        "calc",
        [
            key("ctrl", "home"),
            key("down"),
            key("right"),
            key("right", what="Go to C2: A1:B1 stays in view."),
            key("alt", "v", what="Open the View menu."),
            click(171, 326, "Freeze Rows and Columns."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    # --- multi_apps: the terminal the task opens ---
    (
        "multi_apps",
        "2b9493d7-49b8-493a-a71b-56cd1f4d6908",
        "terminal",
        shell("pkill -9 soffice", "exit"),
    ),
    # --- LibreOffice Impress ---
    (
        "libreoffice_impress",
        "a097acff-6266-4291-9fbd-137af7ecd439",
        "impress",
        [
            key("ctrl", "shift", "s", what="Save As."),
            key("ctrl", "a", what="Select the file name."),
            type_("/home/user/Desktop/pre.pptx\n", "Name the copy."),
            key("enter", what="Keep the current format."),
            done(),
        ],
    ),
    (
        "libreoffice_impress",
        "ce88f674-ab7a-43da-9201-468d38539e4a",
        "impress",
        [
            click(1137, 170, "Open the sidebar's Orientation list."),
            click(1088, 203, "Choose Portrait."),
            click(920, 650, "Click the empty workspace beside the slide, back to the document."),
            *SAVE_KEEP,
            done(),
        ],
    ),
]


def entry(domain: str, task_id: str) -> dict:
    """A task list entry: a reference to OSWorld's config, resolved with ``--osworld``."""
    return {"task_id": task_id, "domain": domain}


def instruction(domain: str, task_id: str) -> str:
    return json.loads((OSWORLD / domain / f"{task_id}.json").read_text())["instruction"]


def main() -> None:
    tasks = [entry(domain, task_id) for domain, task_id, _, _ in SOLVED]
    scripts = {instruction(d, t): responses for d, t, _, responses in SOLVED}
    (HERE / "tasks.json").write_text(json.dumps(tasks, indent=2, ensure_ascii=False) + "\n")
    (HERE / "scripts" / "solve.json").write_text(
        json.dumps({"tasks": scripts}, indent=2, ensure_ascii=False) + "\n"
    )
    # the README's table of tasks
    print("| task | domain | app | metric |\n|---|---|---|---|")
    for domain, task_id, app, _ in SOLVED:
        func = json.loads((OSWORLD / domain / f"{task_id}.json").read_text())["evaluator"]["func"]
        print(
            f"| {task_id[:8]} | {domain} | {app} | {', '.join(func) if isinstance(func, list) else func} |"
        )


if __name__ == "__main__":
    main()
