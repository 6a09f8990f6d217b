"""The ``vm`` desktop session (``--session vm``, desktop option ``session=vm``): a real desktop
server on Xvfb showing the look of OSWorld's VM (top bar, dock, Yaru, "Ubuntu" font, Ubuntu's
colour), opening LibreOffice maximized in the work area, keeping its panels across resets,
opening a favourite inside the sandbox when its dock icon is clicked. docs/local-desktop.md §18."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shlex
import shutil
import stat
import time
from pathlib import Path

import pytest
from PIL import Image

from legato_pipelines.actions import Action
from legato_pipelines.desktops.backends.local import LocalOptions
from legato_pipelines.desktops.server import vm_look
from legato_pipelines.desktops.server.desktop import session_option
from legato_pipelines.errors import ConfigError
from tests.desktop_local_support import RunningServer, needs_xvfb

WIDTH, HEIGHT = 1280, 720
needs_vm_look = pytest.mark.skipif(
    bool(vm_look.missing()), reason=f"apt-get install {' '.join(vm_look.missing())}"
)
pytestmark = [needs_xvfb, needs_vm_look]


@pytest.fixture(scope="module")
def server():
    running = RunningServer(WIDTH, HEIGHT, extra_args=("--session", "vm"))
    yield running
    running.stop()


@pytest.fixture
async def client(server):
    c = server.client()
    await c.reset()
    yield c
    await c.aclose()


def _wallpaper() -> tuple[int, int, int]:
    return tuple(int(vm_look.WALLPAPER[i : i + 2], 16) for i in (1, 3, 5))


async def _look(client) -> dict[str, object]:
    """What a screenshot shows: the top bar's row, the dock's column, the desktop's colour."""
    image = Image.open(io.BytesIO(await client.screenshot())).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    bar = [image.getpixel((x, 4)) for x in range(vm_look.DOCK_PX + 10, WIDTH, 97)]
    # the dock: dark from top to bottom, with the favourites' coloured icons at its top
    dock = [image.getpixel((2, y)) for y in range(vm_look.TOP_BAR_PX, HEIGHT, 53)]
    icons = {image.getpixel((x, y)) for x in range(10, 60, 3) for y in range(40, 300, 3)}
    # the clock: white text in the middle of the top bar
    clock = {
        image.getpixel((x, y))
        for x in range(WIDTH // 2 - 60, WIDTH // 2 + 60)
        for y in range(8, 24)
    }
    desktop = image.getpixel((WIDTH // 2, HEIGHT // 2))
    return {"bar": bar, "dock": dock, "icons": icons, "clock": clock, "desktop": desktop}


def _assert_vm_look(look: dict) -> None:
    assert all(max(p) < 40 for p in look["bar"]), look["bar"]  # a dark bar across the top
    assert all(max(p) < 40 for p in look["dock"]), look["dock"]  # a dark dock down the left
    assert any(max(p) - min(p) > 100 for p in look["icons"]), "no coloured icon in the dock"
    assert any(min(p) > 200 for p in look["clock"]), "no white clock text in the top bar"
    assert look["desktop"] == _wallpaper()


async def test_screenshot_shows_top_bar_dock_and_ubuntu_colour(client):
    _assert_vm_look(await _look(client))
    # the panels are not the task's windows (on the VM GNOME Shell draws them)
    assert await client.windows() == []


async def test_theme_and_font_settings_are_in_effect_inside_the_desktop(client):
    script = (
        "fc-match -f '%{family}\\n' Ubuntu;"
        " gsettings get org.gnome.desktop.interface gtk-theme;"
        " gsettings get org.gnome.desktop.interface icon-theme;"
        " gsettings get org.gnome.desktop.interface font-name;"
        " gsettings get org.gnome.shell favorite-apps;"
        " grep -E 'gtk-(icon-)?theme-name' ~/.config/gtk-3.0/settings.ini"
    )
    done = await client.execute(["bash", "-c", script])
    lines = done["output"].split("\n")
    assert lines[:7] == [
        "Cantarell",
        "'Yaru'",
        "'Yaru'",
        "'Ubuntu 11'",
        str(list(vm_look.FAVOURITES)),
        "gtk-theme-name=Yaru",
        "gtk-icon-theme-name=Yaru",
    ], done


@pytest.mark.skipif(shutil.which("localc") is None, reason="LibreOffice Calc not installed")
async def test_calc_opens_maximized_in_the_work_area_and_xterm_does_not(client):
    await client.launch(["localc", "--norestore"])
    await client.launch(["xterm"])
    windows = []
    for _ in range(240):  # LibreOffice's first start on a busy machine
        windows = await client.windows()
        classes = {w["class"] for w in windows}
        if "libreoffice-calc" in classes and "XTerm" in classes:
            break
        await asyncio.sleep(0.5)
    await client.wait("launch")
    geometry = await client.execute(
        [
            "bash",
            "-c",
            "xdotool search --class libreoffice-calc getwindowgeometry %@;"
            " xdotool search --class XTerm getwindowgeometry %@",
        ]
    )
    text = geometry["output"]
    calc, term = text.split("Window ")[1], text.split("Window ")[-1]
    dock, bar = vm_look.DOCK_PX, vm_look.TOP_BAR_PX
    # maximized: the work area (the screen but the dock and the bar) minus openbox's title bar
    assert f"Position: {dock}," in calc, text
    size = calc.split("Geometry: ")[1].split()[0]
    width, height = (int(v) for v in size.split("x"))
    assert width == WIDTH - dock and HEIGHT - bar - 40 <= height <= HEIGHT - bar, text
    term_size = term.split("Geometry: ")[1].split()[0]
    assert int(term_size.split("x")[0]) < WIDTH - dock, text  # a terminal keeps its size


async def test_panels_survive_a_reset_and_come_back_after_a_full_one(server, client):
    infra = {p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "tint2"}
    assert len(infra) == 2
    await client.launch(["xterm"])
    await client.reset()
    after = {p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "tint2"}
    assert after == infra  # infrastructure: a fast reset leaves them running
    _assert_vm_look(await _look(client))
    await client.reset(full=True)
    restarted = {p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "tint2"}
    assert len(restarted) == 2 and not restarted & infra
    _assert_vm_look(await _look(client))


async def _windows_of(client, cls: str, timeout_s: float = 90.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s  # VLC's first start on a busy machine
    while time.monotonic() < deadline:
        found = [w for w in await client.windows() if w["class"] == cls]
        if found:
            return found
        await asyncio.sleep(0.5)
    return []


@pytest.mark.desktop
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("vlc") is None, reason="VLC not installed (apt-get install vlc)")
async def test_a_click_on_the_dock_opens_the_app_in_the_sandbox_and_a_reset_closes_it(client):
    # the dock's order on this host (favourites not installed are left out), its tint2 layout
    shown = [fav.name for fav in vm_look.favourites()]
    x, y = vm_look.dock_icon_centre(shown.index("vlc.desktop"))
    await client.act(Action("left_click", x=x, y=y))  # the policy's own input path (XTest)
    windows = await _windows_of(client, "vlc")
    assert len(windows) == 1, "a click on VLC's dock icon opened no VLC window"
    assert windows[0]["launched"]  # started by the server, as /setup/launch starts apps
    procs = await client.processes()
    task = {p["pid"] for p in procs["task"] if p["comm"] == "vlc"}
    assert windows[0]["pid"] in task  # a task process: the policy's, not infrastructure
    assert not [p for p in procs["infra"] if p["comm"] == "vlc"]
    # inside the sandbox, as its user, the command of vlc.desktop without %U
    inside = await client.execute(["ps", "-C", "vlc", "-o", "user=,args="])
    assert inside["output"].split() == ["user", "/usr/bin/vlc", "--started-from-file"], inside
    await client.reset()
    procs = await client.processes()
    assert not [p for p in procs["task"] + procs["infra"] if p["comm"] == "vlc"]
    assert await client.windows() == []


@pytest.mark.desktop
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("vlc") is None, reason="VLC not installed (apt-get install vlc)")
async def test_the_action_wait_after_a_dock_click_waits_for_the_apps_window(server, client):
    # what tint2 runs for a click on VLC's icon (its dock entry's Exec), then the action's wait
    with open(Path(server.state) / "dock", "w") as f:
        f.write("vlc.desktop\n")
    done = await client.wait("action", app_window_s=90)
    assert done["mode"] == "action" and not done["timed_out"], done
    assert [w["class"] for w in await client.windows()] == ["vlc"]  # no polling: waited for


@pytest.mark.desktop
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium not installed")
async def test_an_action_wait_the_dock_click_lands_in_waits_for_the_apps_window(server, client):
    # tint2 names the favourite after the click, so the name may reach the server during the
    # action's screen wait (here 1 s into one of 2 s on frames); Chrome draws nothing until
    # its window maps, so the screen wait alone would end before it
    wait = asyncio.create_task(client.wait("action", source="poll", stable_s=2.0, app_window_s=180))
    await asyncio.sleep(1.0)
    with open(Path(server.state) / "dock", "w") as f:
        f.write("google-chrome.desktop\n")
    done = await wait
    assert not done["timed_out"], done
    assert "Google-chrome" in {w["class"] for w in await client.windows()}, done


DROP_SCRIPT = Path(__file__).parent / "data" / "xdnd_drop.py"


@pytest.mark.desktop
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("vlc") is None, reason="VLC not installed (apt-get install vlc)")
async def test_text_dropped_on_the_dock_runs_nothing_on_the_host(client, tmp_path):
    """A task drops text on a dock icon through XDND, as any X client of the desktop can:
    tint2 runs the icon's command with the text appended, and a ``"`` in it used to run
    commands as the panels' user on the host (root here; a newcomer's attack). Now the drop
    opens the icon's app, as a click does, and runs nothing of the text."""
    marker = tmp_path / "dropped-command-ran"
    payload = f'"; touch {marker}; "'
    shown = [fav.name for fav in vm_look.favourites()]
    x, y = vm_look.dock_icon_centre(shown.index("vlc.desktop"))
    script = base64.b64encode(DROP_SCRIPT.read_bytes()).decode()
    command = f"echo {script} | base64 -d > /tmp/drop.py && python3 /tmp/drop.py {x} {y} "
    dropped = await client.execute(["bash", "-c", command + shlex.quote(payload)])
    assert dropped["output"].split() == ["finished", "1"], dropped  # tint2 took the drop
    windows = await _windows_of(client, "vlc")
    assert len(windows) == 1, "the drop did not run the icon's command"
    assert not marker.exists(), "the dropped text ran as a command on the host"


async def test_a_reset_after_a_task_ended_the_panels_starts_them_again(server, client):
    """``xdotool windowkill`` on the panels (a task closing their X connections) ends both
    tint2s; the next reset is a full one and the top bar and dock are back."""
    before = await client.processes()
    assert len([p for p in before["infra"] if p["comm"] == "tint2"]) == 2
    await client.execute(
        ["bash", "-c", "for w in $(xdotool search --class tint2); do xdotool windowkill $w; done"]
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        infra = (await client.processes())["infra"]
        if not [p for p in infra if p["comm"] == "tint2"]:
            break
        await asyncio.sleep(0.2)
    answer = await client.reset()
    assert answer["kind"] == "full", answer
    after = (await client.processes())["infra"]
    assert len([p for p in after if p["comm"] == "tint2"]) == 2
    _assert_vm_look(await _look(client))


@pytest.mark.desktop
@pytest.mark.slow
async def test_the_dock_fifo_is_out_of_the_sandbox_and_names_only_favourites(server, client):
    fifo = Path(server.state) / "dock"
    mode = os.stat(fifo).st_mode
    assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600
    assert os.stat(fifo).st_uid == os.geteuid()  # the server's user's, as tint2
    # the state directory is not in the sandbox: no task process can name an app to it
    seen = await client.execute(["bash", "-c", f"ls -d {server.state} {fifo} 2>&1; true"])
    assert "No such file or directory" in seen["output"], seen
    # a line naming no favourite (or a command) opens nothing; only the dock's names count
    with open(fifo, "w") as f:
        f.write("xterm.desktop\nxterm\n")
    await asyncio.sleep(1.0)
    assert (await client.processes())["task"] == []


def test_session_option_is_checked_with_the_choices():
    assert LocalOptions(session="vm").session == "vm"
    assert session_option(None) == "plain" and session_option("vm") == "vm"
    with pytest.raises(ConfigError, match="'session'.*plain, vm"):
        session_option("gnome")


#: OSWorld's os task ec4e3f68's setup: its favourites, set with gsettings over the session bus
#: at the path its config exports
TASK_FAVOURITES = ["thunderbird.desktop", "vim.desktop", "google-chrome.desktop"]
SETUP = (
    "export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\n"
    "gsettings set org.gnome.shell favorite-apps \"['thunderbird.desktop']\"\n"
    f'gsettings set org.gnome.shell favorite-apps "{TASK_FAVOURITES}"'
)


def _dock_entries(server) -> list[str]:
    """The favourites of the launcher entries tint2 reads (``NN-name``), in the dock's order,
    checked against the dock's configuration."""
    panels = Path(server.state) / "wm" / "panels"
    items = [
        line.split("=", 1)[1].strip()
        for line in (panels / "dock.tint2rc").read_text().splitlines()
        if line.startswith("launcher_item_app")
    ]
    assert sorted(items) == sorted(str(p) for p in (panels / "dock-applications").iterdir())
    return [Path(item).name.split("-", 1)[1] for item in items]


async def _icon_slots(client, count: int) -> list[bytes]:
    """The pixels of the dock's first ``count`` icon slots (48 px squares), top first."""
    image = Image.open(io.BytesIO(await client.screenshot())).convert("RGB")
    slots = []
    for index in range(count):
        x, y = vm_look.dock_icon_centre(index)
        slots.append(image.crop((x - 20, y - 20, x + 20, y + 20)).tobytes())
    return slots


def _plain(slot: bytes) -> bool:
    return slot == slot[:3] * (len(slot) // 3)


@pytest.mark.desktop
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("thunderbird") is None, reason="Thunderbird not installed")
async def test_the_dock_shows_favourite_apps_from_dconf_and_a_reset_restores_it(server, client):
    default = [fav.name for fav in vm_look.favourites()]  # the baseline's, installed here
    assert len(default) > len(TASK_FAVOURITES)
    assert _dock_entries(server) == default
    before = await _icon_slots(client, len(TASK_FAVOURITES) + 1)
    assert not any(_plain(slot) for slot in before)  # an icon in every slot
    infra = {p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "tint2"}

    # the task's setup, then the ready wait before its first observation
    done = await client.execute(SETUP, shell=True)
    assert done["returncode"] == 0, done
    await client.wait("reset")
    assert _dock_entries(server) == TASK_FAVOURITES  # vim.desktop: Debian's vim-common has it
    after = await _icon_slots(client, len(TASK_FAVOURITES) + 1)
    assert not any(_plain(slot) for slot in after[:-1]) and _plain(after[-1]), "4th slot drawn"
    assert after[0] != before[0]  # Thunderbird's icon where Chrome's was
    # a new dock's tint2 replaced the old one, infrastructure as the top bar's (kept)
    now = {p["pid"] for p in (await client.processes())["infra"] if p["comm"] == "tint2"}
    assert len(now) == 2 and len(now & infra) == 1, (infra, now)

    # the dock's FIFO accepts the favourites shown only: VLC is not one any more
    with open(Path(server.state) / "dock", "w") as f:
        f.write("vlc.desktop\n")
    x, y = vm_look.dock_icon_centre(0)
    await client.act(Action("left_click", x=x, y=y))  # the new first icon: Thunderbird
    await client.wait("action", app_window_s=120)
    deadline = time.monotonic() + 120
    comms: set[str] = set()
    while time.monotonic() < deadline and "thunderbird" not in comms:
        comms = {p["comm"] for p in (await client.processes())["task"]}
        await asyncio.sleep(0.5)
    assert "thunderbird" in comms, comms
    assert "vlc" not in comms

    # a reset makes HOME the baseline's again: its favourites, its dock
    await client.reset()
    assert _dock_entries(server) == default
    restored = await _icon_slots(client, len(TASK_FAVOURITES) + 1)
    assert restored == before
    listed = await client.execute(["gsettings", "get", "org.gnome.shell", "favorite-apps"])
    assert listed["output"].strip() == str(list(vm_look.FAVOURITES))


@pytest.mark.desktop
@pytest.mark.slow
async def test_gsettings_ending_during_an_action_wait_shows_in_the_dock_at_its_end(server, client):
    # the policy's gsettings in a terminal ends after the keypress that started it: here 1 s
    # into an action wait of 2 s on frames, which looks at dconf again when it ends
    wait = asyncio.create_task(client.wait("action", source="poll", stable_s=2.0))
    await asyncio.sleep(1.0)
    done = await client.execute(
        ["gsettings", "set", "org.gnome.shell", "favorite-apps", "['vim.desktop']"]
    )
    assert done["returncode"] == 0, done
    await wait
    assert _dock_entries(server) == ["vim.desktop"]
    slots = await _icon_slots(client, 2)
    assert not _plain(slots[0]) and _plain(slots[1])
    # vim.desktop says Terminal=true: a click runs vim in a terminal, as GLib does
    x, y = vm_look.dock_icon_centre(0)
    await client.act(Action("left_click", x=x, y=y))
    await client.wait("action", app_window_s=60)
    deadline = time.monotonic() + 60
    inside = {}
    while time.monotonic() < deadline and "vim" not in inside.get("output", ""):
        inside = await client.execute(["bash", "-c", "ps -C vim -o user=,args=; true"])
        await asyncio.sleep(0.5)
    assert inside["output"].split() == ["user", "vim"], inside
    parent = await client.execute(["bash", "-c", "ps -o comm= -p $(ps -o ppid= -C vim)"])
    terminal = vm_look.terminal_prefix()[0]  # gnome-terminal's window is its server's
    assert parent["output"].strip() == {"gnome-terminal": "gnome-terminal-"}.get(terminal, terminal)
    # a full reset starts the panels again: with the baseline's dock
    await client.reset(full=True)
    assert _dock_entries(server) == [fav.name for fav in vm_look.favourites()]
    slots = await _icon_slots(client, 2)
    assert not any(_plain(slot) for slot in slots)
