"""Build the solved OSWorld task list: ``tasks.json`` and the scripted policy's ``scripts/solve.json``.

Run ``python examples/tasks/osworld_solved/build.py`` after editing; the JSON files are committed.

Real OSWorld tasks (their configs in ``tests/data/osworld``, resolved with ``--osworld
tests/data/osworld``) that a scripted policy solves on local desktops with policy actions only:
keystrokes, typing, menus, one click in the middle of the screen, commands typed into a
terminal. No action depends on the screen's size or the desktop's session: the suite runs at
``legato collect``'s defaults for OSWorld's tasks (1920x1080, the local backend's ``vm``
session) as at any other screen. Every entry references OSWorld's config unchanged: setup and evaluator are
OSWorld's, and nothing in the setup solves a task. ``scripts/solve.json`` is in the scripted
policy server's format ``{"tasks": {"<instruction>": ["<Qwen computer-use response>", ...]}}``;
the files the tasks download and compare against are built by ``files.py`` (openpyxl,
python-docx, python-pptx).

The ``os`` tasks set up no terminal: on OSWorld's VM (a GNOME session) the agent opens one
with Ctrl+Alt+T, and so do these scripts, as their first action (local desktops open
gnome-terminal on that key like GNOME: docs/local-desktop.md). The GIMP and VLC tasks' setups
launch the app; the desktops' reset wait waits for its main window. The Thunderbird task's
profile is ``files.py``'s stand-in (a Local Folders account, no download); its script picks a
menu item by keys, graded from ``xulstore.json`` once the postconfig closes Thunderbird.
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
done, key, type_, wait = _local.done, _local.key, _local.type_, _local.wait
qwen_response = _local.qwen_response

#: The middle of the screen on Qwen3-VL's 0..999 grid (OSWorld maps it back with ``x * W / 999``):
#: the same place on every screen size.
MIDDLE = [500, 500]

#: GIMP's main window is up when the reset's wait ends, but it keeps loading for a moment on
#: loaded cores before it takes keys.
WAIT = wait(3, "Wait for GIMP to finish starting.")

#: VLC's Simple Preferences dialog (Ctrl+P) opens with the keyboard focus on its "Simple"
#: radio button. Tab goes on to Reset Preferences, then to the category bar's selected button
#: (Interface), whose Left/Right arrows select the previous/next category (they are an
#: exclusive button group), then into the page's fields in reading order. VLC's checkboxes have
#: no mnemonics: the scripts reach them by Tab, as a model watching the focus ring would, and
#: toggle them with the space bar. Keys only: no pixel of the dialog, so no screen size,
#: window size or theme moves them.
VLC_PREFS = [
    # the middle of the screen is VLC's video area on any screen size (OSWorld's own VLC setups
    # click there): on the osworld backend VLC's window was once not focused, and Ctrl+P was lost
    qwen_response(
        "Click VLC's window to focus it.", {"action": "left_click", "coordinate": MIDDLE}
    ),
    key("ctrl", "p", what="Open VLC's Simple Preferences (Tools > Preferences)."),
    # the dialog draws its pages lazily: on loaded cores keys sent at once were early
    wait(1, "Wait for the preferences dialog."),
]


def tabs(n: int, to: str) -> list[str]:
    """``n`` presses of Tab, the last one landing on ``to`` (VLC's dialog, :data:`VLC_PREFS`)."""
    return [key("tab") for _ in range(n - 1)] + [key("tab", what=f"Tab to {to}.")]


#: From the dialog's first focus to the category bar (Simple > Reset Preferences > Interface).
VLC_CATEGORIES = tabs(2, "the category bar's Interface button")


VLC_SAVE = key("alt", "s", what="Save the preferences (the dialog's Save button, Alt+S).")

SAVE_KEEP = [
    key("ctrl", "s", what="Save the document with Ctrl+S."),
    wait(2, "Wait for the format question."),
    key("enter", what="Keep the current format in the dialog."),
]


def shell(*commands: str, then_wait_s: float = 0) -> list[str]:
    """Type each command into the open terminal, wait ``then_wait_s`` seconds when given (for
    commands still running after they were typed), then report success."""
    typed = [type_(f"{command}\n") for command in commands]
    settle = [wait(then_wait_s, "Wait for the commands to finish.")] if then_wait_s else []
    return [*typed, *settle, done()]


#: How the agent gets a terminal on OSWorld's GNOME VM (the ``os`` tasks open none).
OPEN_TERMINAL = key("ctrl", "alt", "t", what="Open a terminal with Ctrl+Alt+T.")


def terminal(*commands: str, then_wait_s: float = 0) -> list[str]:
    """Open a terminal (:data:`OPEN_TERMINAL`), give it 4 s more than the desktop's wait for it
    (at most 5 s: on a loaded machine it came up to 8 s after the key, and the first command
    went to the app below), then :func:`shell`."""
    settle = wait(4, "Wait for the terminal.")
    return [OPEN_TERMINAL, settle, *shell(*commands, then_wait_s=then_wait_s)]


def infeasible(why: str) -> list[str]:
    """The answer to an infeasible task: ``terminate`` with status ``failure`` (OSWorld's FAIL,
    which its ``infeasible`` metric scores 1; doing nothing, a ``terminate`` success, scores 0)."""
    return [qwen_response(why, {"action": "terminate", "status": "failure"})]


def command_search(command: str) -> list[str]:
    """Run a LibreOffice menu command by name: Help > Search Commands (Shift+Esc, LibreOffice
    7.2+), type its label, Enter. No pixels: the same on every screen size and toolbar layout."""
    return [
        key("shift", "escape", what="Open LibreOffice's Search Commands box."),
        wait(2, "Wait for the box."),
        type_(command, f"Search for {command}."),
        wait(1, "Wait for the matches."),
        key("enter", what=f"Run {command}."),
    ]


def stop_then(process: str, *commands: str) -> list[str]:
    """Open a terminal, stop ``process`` (its exact name) and wait until it is gone, so it does
    not write its settings back over the edit, then type ``commands``, and give them 3 s to
    run before the attempt ends (an app slow to exit on a loaded machine keeps the shell's
    loop going, and the edit typed after it would run only once grading had begun)."""
    return terminal(
        f"pkill -x {process}; while pgrep -x {process} >/dev/null; do sleep 0.3; done",
        *commands,
        then_wait_s=3,
    )


#: Chromium's profile files on the desktop (the google-chrome profile OSWorld's getters read).
CHROME_PROFILE = "~/.config/google-chrome/Default"


def chrome_prefs(edit: str, file: str = "Preferences") -> list[str]:
    """Stop Chrome, then edit its profile's JSON ``file`` as ``d`` with the Python statement
    ``edit`` (the task's postconfig starts Chrome again on the edited profile)."""
    return stop_then(
        "chrome",
        "python3 -c \"import json,os; p=os.path.expanduser('"
        + f"{CHROME_PROFILE}/{file}"
        + "'); d=json.load(open(p)) if os.path.exists(p) else {}; "
        + edit
        + "; json.dump(d,open(p,'w'))\"",
    )


#: The video types OSWorld's ``default_video_player`` getter asks xdg-mime about.
VIDEO_TYPES = (
    "3gp 3gpp 3gpp2 avi divx dv fli flv mp2t mp4 mp4v-es mpeg mpeg-system msvideo ogg quicktime "
    "vnd.divx vnd.mpegurl vnd.rn-realvideo webm x-anim x-avi x-flc x-fli x-flv x-m4v x-matroska "
    "x-mpeg x-mpeg-system x-mpeg2 x-ms-asf x-ms-asf-plugin x-ms-asx x-ms-wm x-ms-wmv x-ms-wmx "
    "x-ms-wvx x-msvideo x-nsv x-ogm x-ogm+ogg x-theora x-theora+ogg"
)

#: LibreOffice's user settings, where Tools > Options saves what it changes.
LO_REGISTRY = "~/.config/libreoffice/4/user/registrymodifications.xcu"


def new_folder(name: str) -> list[str]:
    """Thunderbird's File > New > Folder..., named ``name``, under the selected folder."""
    return [
        key("alt", "f", what="Open Thunderbird's File menu."),
        key("n", what="New."),
        key("f", what="Folder..."),
        wait(2, "Wait for the New Folder dialog."),
        type_(name, f"Name it {name}."),
        key("enter", what="Create it."),
        wait(1, "Wait for the folder."),
    ]


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
            *command_search("Character"),
            wait(1, "Wait for the Character dialog (its Font tab has the focus)."),
            key("tab", what="Into the tab's first field, Family."),
            key("ctrl", "a", what="Select the family name."),
            type_("Times New Roman", "Set the font family."),
            key("enter", what="OK."),
            wait(2, "Wait for the dialog to close."),
            key("ctrl", "home", what="Drop the selection (the Enter below must not replace it)."),
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
        [
            *VLC_PREFS,
            # Simple > Reset Preferences > Interface > the page > Use native style > Show
            # controls in full screen mode > Integrate video > Resize interface > minimal view
            *tabs(8, "Start in minimal view mode"),
            key("space", what="Tick it."),
            VLC_SAVE,
            done(),
        ],
    ),
    (
        "vlc",
        "f3977615-2b45-4ac5-8bba-80c17dbe2a37",
        "vlc",
        [
            *VLC_PREFS,
            # past the Interface page's Look and feel fields (8 Tabs reach minimal view mode; then
            # Pause playback, systray, the three lists) and Allow only one instance
            *tabs(15, "Use only one instance when started from file manager"),
            key("space", what="Untick it."),
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
            *VLC_CATEGORIES,
            *[key("right") for _ in range(3)],
            key("right", what="Interface > Audio > Video > Subtitles / OSD > Input / Codecs."),
            # from the category button: the page, then Codecs (hardware decoding, fast seek,
            # post-processing, H.264 deblocking, x264 preset, tuning, profile, level), Optical
            # drive (default device), Files: Record directory or filename
            *tabs(11, "the Record directory or filename field"),
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
            *command_search("Freeze Rows and Columns"),
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
            wait(2, "Wait for the file chooser."),
            key("ctrl", "a", what="Select the file name."),
            type_("/home/user/Desktop/pre.pptx", "Name the copy."),
            wait(1, "Let the file chooser's path completion settle."),
            key("enter", what="Save."),
            wait(2, "Wait for the format question."),
            key("enter", what="Keep the current format."),
            done(),
        ],
    ),
    (
        "libreoffice_impress",
        "ce88f674-ab7a-43da-9201-468d38539e4a",
        "impress",
        [
            key("f10", what="Open the File menu."),
            *[key("right") for _ in range(4)],
            key("right", what="The Slide menu (Search Commands does not list its items)."),
            *[key("down") for _ in range(5)],
            key("down", what="Slide Properties... (Delete Slide and Save Background are off)."),
            key("enter", what="Open Slide Properties."),
            wait(2, "Wait for the Slide Properties dialog."),
            key("alt", "p", what="Orientation: Portrait."),
            key("enter", what="OK."),
            wait(2, "Wait for the dialog to close and the slide to change (else Ctrl+S is lost)."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    # --- os: more settings from a terminal; the infeasible ones answered FAIL ---
    (
        "os",
        "a462a795-fdc7-4b23-b689-e8b6df786b78",
        "terminal",
        infeasible("There is no user Charles on this machine: infeasible."),
    ),
    (
        "os",
        "b3d4a89c-53f2-4d6b-8b6a-541fb5d205fa",
        "terminal",
        infeasible("This machine has no Bluetooth adapter: infeasible."),
    ),
    (
        "os",
        "fe41f596-a71b-4c2f-9b2f-9dcd40b568c3",
        "terminal",
        infeasible("This machine has no battery: infeasible."),
    ),
    (
        "os",
        "c288e301-e626-4b98-a1ab-159dcb162af5",
        "terminal",
        infeasible("There is no Python 4: infeasible."),
    ),
    (
        "os",
        "4783cc41-c03c-4e1b-89b4-50658f642bd5",
        "terminal",
        infeasible("$sourceDir and $targetDir are not set: infeasible."),
    ),
    # --- GIMP: its settings in gimprc, with GIMP stopped; the infeasible ones answered FAIL ---
    (
        "gimp",
        "7b7617bd-57cc-468e-9c91-40c4ec2bcb3d",
        "gimp",
        [WAIT, *stop_then("gimp", "echo '(undo-levels 100)' >> ~/.config/GIMP/2.10/gimprc")],
    ),
    (
        "gimp",
        "7767eef2-56a3-4cea-8c9f-48c070c7d65b",
        "gimp",
        [WAIT, *stop_then("gimp", "echo '(theme \"Light\")' >> ~/.config/GIMP/2.10/gimprc")],
    ),
    (
        "gimp",
        "e19bd559-633b-4b02-940f-d946248f088e",
        "gimp",
        infeasible("There is no photo on the desktop: infeasible."),
    ),
    (
        "gimp",
        "fbb548ca-c2a6-4601-9204-e39a2efc507b",
        "gimp",
        infeasible("GIMP has no Blue colour theme: infeasible."),
    ),
    (
        "gimp",
        "5ca86c6f-f317-49d8-b6a7-b527541caae8",
        "gimp",
        infeasible("GIMP cannot download files from the web: infeasible."),
    ),
    # --- LibreOffice Impress: menus by keyboard; a setting in the user profile ---
    (
        "libreoffice_impress",
        "ef9d12bd-bcee-4ba0-a40e-918400f43ddf",
        "impress",
        [
            key("f10", what="Open the menu bar."),
            key("right"),
            key("right", what="The View menu."),
            *[key("down") for _ in range(10)],
            key("down", what="View > Slide Pane."),
            key("enter", what="Show the slide pane."),
            done(),
        ],
    ),
    (
        "libreoffice_impress",
        "2cd43775-7085-45d8-89fa-9e35c0a915cf",
        "impress",
        stop_then(
            "soffice.bin",
            'sed -i \'s#</oor:items>#<item oor:path="/org.openoffice.Office.Common/Save/Document">'
            '<prop oor:name="AutoSave" oor:op="fuse"><value>true</value></prop></item>'
            '<item oor:path="/org.openoffice.Office.Common/Save/Document">'
            '<prop oor:name="AutoSaveTimeIntervall" oor:op="fuse"><value>3</value></prop>'
            f"</item></oor:items>#' {LO_REGISTRY}",
        ),
    ),
    # --- VLC: settings in vlcrc's [qt] section, with VLC stopped; infeasible ones FAIL ---
    (
        "vlc",
        "9195653c-f4aa-453d-aa95-787f6ccfaae9",
        "vlc",
        stop_then("vlc", "sed -i '/^\\[qt\\]/a qt-max-volume=200' ~/.config/vlc/vlcrc"),
    ),
    (
        "vlc",
        "d06f0d4d-2cd5-4ede-8de9-598629438c6e",
        "vlc",
        stop_then(
            "vlc",
            "sed -i '/^\\[qt\\]/a qt-slider-colours=20;20;20;40;40;40;60;60;60;30;30;30'"
            " ~/.config/vlc/vlcrc",
        ),
    ),
    (
        "vlc",
        "215dfd39-f493-4bc3-a027-8a97d72c61bf",
        "vlc",
        stop_then("vlc", "sed -i '/^\\[qt\\]/a qt-bgcone=0' ~/.config/vlc/vlcrc"),
    ),
    (
        "vlc",
        "cb130f0d-d36f-4302-9838-b3baf46139b6",
        "vlc",
        infeasible("VLC has no automatic match to the room's lighting: infeasible."),
    ),
    (
        "vlc",
        "7882ed6e-bece-4bf0-bada-c32dc1ddae72",
        "vlc",
        infeasible("VLC cannot play Google Play purchases: infeasible."),
    ),
    # --- Chrome: a settings page by URL; profile settings with Chrome stopped ---
    (
        "chrome",
        "12086550-11c0-466b-b367-1d9e75b3910e",
        "chrome",
        [
            key("ctrl", "l", what="Focus the address bar."),
            type_("chrome://password-manager/passwords\n", "Open the password manager."),
            done(),
        ],
    ),
    (
        "chrome",
        "bb5e4c0d-f964-439c-97b6-bdb9747de3f4",
        "chrome",
        chrome_prefs(
            "d['default_search_provider_data']={'template_url_data':{'short_name':'Bing',"
            "'keyword':'bing.com','url':'https://www.bing.com/search?q={searchTerms}'}}"
        ),
    ),
    (
        "chrome",
        "2ae9ba84-3a0d-4d4c-8338-3a1478dc5fe3",
        "chrome",
        chrome_prefs("d.setdefault('profile',{})['name']='Thomas'"),
    ),
    (
        "chrome",
        "af630914-714e-4a24-a7bb-f9af687d3b91",
        "chrome",
        chrome_prefs("d.setdefault('webkit',{}).setdefault('webprefs',{})['default_font_size']=24"),
    ),
    (
        "chrome",
        "99146c54-4f37-4ab8-9327-5f3291665e1e",
        "chrome",
        chrome_prefs(
            "d.setdefault('profile',{}).setdefault('default_content_setting_values',{})"
            "['cookies']=4"
        ),
    ),
    (
        "chrome",
        "030eeff7-b492-4218-b312-701ec99ee0cc",
        "chrome",
        chrome_prefs("d['enable_do_not_track']=True"),
    ),
    (
        "chrome",
        "2ad9387a-65d8-4e33-ad5b-7580065a27ca",
        "chrome",
        chrome_prefs(
            "r=d.setdefault('roots',{}); d.setdefault('version',1); "
            "[r.setdefault(k,{'children':[],'type':'folder','name':n,'id':i}) for k,n,i in "
            "(('bookmark_bar','Bookmarks bar','1'),('other','Other bookmarks','2'),"
            "('synced','Mobile bookmarks','3'))]; "
            "r['bookmark_bar']['children'].append({'type':'folder','name':'Favorites',"
            "'children':[],'id':'100','date_added':'13300000000000000'}); d.pop('checksum',0)",
            file="Bookmarks",
        ),
    ),
    (
        "chrome",
        "480bcfea-d68f-4aaa-a0a9-2589ef319381",
        "chrome",
        infeasible("Chrome has no switch back to its pre-2023 design: infeasible."),
    ),
    (
        "chrome",
        "3720f614-37fd-4d04-8a6b-76f54f8c222d",
        "chrome",
        infeasible("Chrome has no Xenothian interface language: infeasible."),
    ),
    (
        "chrome",
        "ae78f875-5b98-4907-bbb5-9c737fc68c03",
        "chrome",
        infeasible("Chrome has no setting for the number of search results: infeasible."),
    ),
    # --- multi_apps: default apps from a terminal; an infeasible export ---
    (
        "multi_apps",
        "937087b6-f668-4ba6-9110-60682ee33441",
        "terminal",
        terminal(f"for t in {VIDEO_TYPES}; do xdg-mime default vlc.desktop video/$t; done"),
    ),
    (
        "multi_apps",
        "6d72aad6-187a-4392-a4c4-ed87269c51cf",
        "impress",
        infeasible("Impress cannot export a presentation as a video: infeasible."),
    ),
    # --- os: files the setup makes (files.py writes its setup.sh and eval.sh), in a terminal ---
    (
        "os",
        "5ced85fc-fa1a-4217-95fd-0fb530545ce2",
        "terminal",
        shell("printf '1\\n2\\n3\\n' | sed 's#$#<br/>#' > output.txt"),
    ),
    (
        "os",
        "6f56bf42-85b8-4fbb-8e06-6c44960184ba",
        "terminal",
        shell("for d in dir1 dir2 dir3; do cp file1 $d/; done"),
    ),
    (
        "os",
        "4d117223-a354-47fb-8b45-62ab1390a95f",
        "terminal",
        shell("find . -type f -exec chmod 644 {} +"),
    ),
    (
        "os",
        "5c1075ca-bb34-46a3-a7a0-029bd7463e79",
        "terminal",
        shell(
            "mkdir -p fails && find . -path ./fails -prune -o -name '*failed.ipynb' -exec cp --parents {} fails/ \\;"
        ),
    ),
    (
        "os",
        "5ea617a3-0e86-4ba6-aab2-dac9aa2e8d57",
        "terminal",
        terminal("mv ~/.local/share/Trash/files/poster_party_night.webp ~/Desktop/"),
    ),
    # --- LibreOffice Writer and Calc: more documents (files.py) ---
    (
        "libreoffice_writer",
        "72b810ef-4156-4d09-8f08-a0cf57e7cefe",
        "writer",
        [
            key("ctrl", "end", what="Go to the end of the last paragraph (one line)."),
            key("shift", "home", what="Select the paragraph."),
            *command_search("Strikethrough"),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "f178a4a9-d090-4b56-bc4c-4b72a61a035d",
        "writer",
        stop_then(
            "soffice.bin",
            'sed -i \'s#</oor:items>#<item oor:path="/org.openoffice.Office.Writer/DefaultFont">'
            '<prop oor:name="Standard" oor:op="fuse"><value>Times New Roman</value></prop>'
            f"</item></oor:items>#' {LO_REGISTRY}",
        ),
    ),
    (
        "libreoffice_writer",
        "bb8ccc78-479f-4a2f-a71e-d565e439436b",
        "writer",
        infeasible("LibreOffice has no real-time co-editing: infeasible."),
    ),
    (
        "libreoffice_calc",
        "1334ca3e-f9e3-4db8-9ca7-b4c653be7d17",
        "calc",
        [
            # a zoom alone leaves the document unmodified, and Calc does not save an unmodified
            # document: type into an empty cell (F1) and delete it again first
            *[key("right") for _ in range(4)],
            key("right", what="Go to F1, an empty cell."),
            type_("x\n", "Type into it."),
            key("up"),
            key("delete", what="Empty it again: the data is as it was, the document modified."),
            *command_search("Zoom"),
            wait(1, "Wait for the Zoom dialog (its Variable field has the focus)."),
            key("ctrl", "a"),
            type_("150%\n", "Zoom to 150 %."),
            *SAVE_KEEP,
            done(),
        ],
    ),
    (
        "libreoffice_writer",
        "0810415c-bde4-4443-9047-d5f70165a697",
        "writer",
        [
            key("ctrl", "home", what="Go to the first paragraph."),
            key("ctrl", "shift", "down", what="Select to its end."),
            key("ctrl", "shift", "down", what="And to the end of the second."),
            *command_search("Line Spacing: 2"),
            *SAVE_KEEP,
            done(),
        ],
    ),
    # --- Thunderbird: the profile is files.py's stand-in (a Local Folders account) ---
    (
        "thunderbird",
        "3f49d2cc-f400-4e7d-90cc-9b18e401cc31",
        "thunderbird",
        [
            key("alt", "v", what="Open the View menu (Thunderbird shows its menu bar with Alt)."),
            key("f", what="Folders."),
            key("u", what="Unified Folders."),
            key("escape", what="Close the menu."),
            done(),
        ],
    ),
    (
        "thunderbird",
        "a10b69e1-6034-4a2b-93e1-571d45194f75",
        "thunderbird",
        [
            *new_folder("COMPANY"),
            *new_folder("UNIVERSITY"),
            done(),
        ],
    ),
    (
        "thunderbird",
        "a1af9f1c-50d5-4bc3-a51e-4d9b425ff638",
        "thunderbird",
        infeasible(
            "Thunderbird cannot send from an account without its incoming server: infeasible."
        ),
    ),
]


#: run.py's ``--image-max``: the longest script the scripted server follows to its end.
IMAGE_MAX = 40

#: The apps whose documents a setup opens; their scripts start with :data:`LO_READY`.
LIBREOFFICE = ("writer", "calc", "impress")
#: A loaded machine shows LibreOffice's document window before it takes keys (its toolbars and
#: status bar not drawn yet): the keys sent then are lost. The LibreOffice scripts wait first.
LO_READY = wait(5, "Wait for LibreOffice to finish loading the document.")


def script(app: str, responses: list[str]) -> list[str]:
    """A task's responses as served: :data:`LO_READY` first for a LibreOffice app's actions
    (not for an answer that only terminates)."""
    acts = len(responses) > 1
    return [LO_READY, *responses] if app in LIBREOFFICE and acts else responses


def entry(domain: str, task_id: str) -> dict:
    """A task list entry: a reference to OSWorld's config, resolved with ``--osworld``."""
    return {"task_id": task_id, "domain": domain}


def instruction(domain: str, task_id: str) -> str:
    return json.loads((OSWORLD / domain / f"{task_id}.json").read_text())["instruction"]


def main() -> None:
    tasks = [entry(domain, task_id) for domain, task_id, _, _ in SOLVED]
    scripts = {instruction(d, t): script(app, responses) for d, t, app, responses in SOLVED}
    longest = max(len(responses) for responses in scripts.values())
    if longest > IMAGE_MAX:  # run.py's --image-max: the scripted server would repeat a step
        raise SystemExit(f"a script has {longest} responses, more than run.py's {IMAGE_MAX}")
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
