"""The ``vm`` session's dock: a favourite's command as GNOME runs it (field codes dropped), the
FIFO its icons name favourites on, the icons' places, the favourites of a ``favorite-apps``
value as GNOME Shell picks them, the look at the dconf database (legato_pipelines/desktops/
server/dock_channel.py, dock_favourites.py, vm_look.py; docs/local-desktop.md §18). The click
and the dock following dconf on a real desktop: test_vm_session.py."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from legato_pipelines.desktops.server import vm_look
from legato_pipelines.desktops.server.dock_channel import DockChannel
from legato_pipelines.desktops.server.dock_favourites import DockFavourites


@pytest.mark.parametrize(
    ("exec_line", "argv"),
    [
        ("/usr/bin/vlc --started-from-file %U", ["/usr/bin/vlc", "--started-from-file"]),
        ("libreoffice --writer %U", ["libreoffice", "--writer"]),
        ("/usr/bin/thunderbird %u", ["/usr/bin/thunderbird"]),
        ("gimp-2.10 %F", ["gimp-2.10"]),
        ('app "two words" --f=%f 100%%', ["app", "two words", "--f=", "100%"]),
        ("app %i %c %k", ["app", "--icon", "vlc", "VLC media player", "/x/vlc.desktop"]),
    ],
)
def test_exec_is_run_as_gnome_runs_it_without_files(exec_line, argv):
    got = vm_look.exec_argv(exec_line, title="VLC media player", icon="vlc", path="/x/vlc.desktop")
    assert got == argv


def test_favourites_prefer_the_first_folder_and_take_debian_names(tmp_path):
    seed, host = tmp_path / "seed", tmp_path / "host"
    seed.mkdir()
    host.mkdir()
    entry = "[Desktop Entry]\nName={name}\nIcon={icon}\nExec={exec}\n"
    (host / "chromium.desktop").write_text(
        entry.format(name="Chromium", icon="chromium", exec="/usr/bin/chromium %U")
    )
    (host / "vlc.desktop").write_text(entry.format(name="VLC", icon="vlc", exec="vlc %U"))
    (host / "gimp.desktop").write_text("[Desktop Entry]\nName=GIMP\n")  # no Exec: left out
    found = vm_look.favourites([host])
    assert [(f.name, f.argv) for f in found] == [
        ("google-chrome.desktop", ("/usr/bin/chromium",)),
        ("vlc.desktop", ("vlc",)),
    ]
    (seed / "google-chrome.desktop").write_text(
        entry.format(name="Google Chrome", icon="chromium", exec="/usr/bin/google-chrome-stable %U")
    )
    chrome = vm_look.favourites([seed, host])[0]
    assert chrome.argv == ("/usr/bin/google-chrome-stable",) and chrome.title == "Google Chrome"


def test_dock_entries_hand_the_launch_to_the_fifo(tmp_path):
    channel = DockChannel(tmp_path / "dock")
    try:
        mode = os.stat(channel.path).st_mode
        assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600
        found = vm_look.favourites()
        if not found:
            pytest.skip("no favourite of the dock is installed")
        configs = vm_look.panel_configs(tmp_path / "panels", found, channel.exec_line)
        assert configs[1].read_text().count("launcher_item_app") == len(found)
        for path in sorted((tmp_path / "panels/dock-applications").iterdir()):
            exec_line = next(x for x in path.read_text().splitlines() if x.startswith("Exec="))
            subprocess.run(["sh", "-c", exec_line[len("Exec=") :]], check=True, timeout=10)
        assert channel.take() == [fav.name for fav in found]
        os.write(channel.fd, b"half")  # an incomplete line waits for its end
        assert channel.take() == []
        os.write(channel.fd, b".desktop\n" + b"x" * 300 + b"\n")  # over-long lines dropped
        assert channel.take() == ["half.desktop"]
    finally:
        channel.close()
    assert not channel.path.exists()


def test_dock_icon_centres_follow_tint2s_vertical_layout():
    # measured on a 1280x720 vm desktop: the dock starts below the 32 px top bar, as Ubuntu's;
    # the first icon spans x 16-55, y 44-83; one every 48 px
    assert vm_look.dock_icon_centre(0) == (36, 64)
    assert vm_look.dock_icon_centre(2) == (36, 160)


def test_favourites_of_a_dconf_value_are_picked_as_gnome_shell_picks_them(tmp_path):
    apps = tmp_path / "applications"
    apps.mkdir()
    entry = "[Desktop Entry]\nName={name}\nIcon=x\nExec={exec}\n"
    (apps / "vlc.desktop").write_text(entry.format(name="VLC", exec="vlc %U"))
    (apps / "hidden.desktop").write_text(entry.format(name="H", exec="h") + "NoDisplay=true\n")
    (apps / "vim.desktop").write_text(entry.format(name="Vim", exec="vim %F") + "Terminal=true\n")
    (tmp_path / "secret.desktop").write_text(entry.format(name="S", exec="s"))
    names = [
        "code.desktop",  # not installed: left out, as GNOME leaves out ids it cannot look up
        "vim.desktop",
        "vlc.desktop",
        "vim.desktop",  # a repeated id: once, at its first place
        "hidden.desktop",  # NoDisplay: GLib's should_show is false
        "../secret.desktop",  # no plain desktop file name: never a path
        "vlc.desktop\nlauncher_item_app = /x",  # nor a tint2 config line
    ]
    found = vm_look.favourites([apps], names)
    assert [f.name for f in found] == ["vim.desktop", "vlc.desktop"]
    # Terminal=true: the command in a terminal, as GLib runs it
    assert found[0].argv[-1] == "vim" and found[0].argv[:-1] in (
        ("gnome-terminal", "--"),
        ("xterm", "-e"),
    )
    assert vm_look.favourites([apps], []) == []


@pytest.mark.parametrize(
    ("printed", "names"),
    [
        ("['thunderbird.desktop', 'vim.desktop']\n", ["thunderbird.desktop", "vim.desktop"]),
        ("@as []\n", []),
        ("['it\\'s.desktop']", ["it's.desktop"]),
        ("'vim.desktop'", None),
        ("[1, 2]", None),
        ("__import__('os')", None),
        ("", None),
    ],
)
def test_gsettings_output_is_read_as_a_string_list(printed, names):
    assert vm_look.parse_favourites(printed) == names


def test_a_new_list_replaces_the_dock_entries_and_the_fifo_accepts_only_those(tmp_path):
    apps = tmp_path / "applications"
    apps.mkdir()
    for name in ("a", "b", "c"):
        (apps / f"{name}.desktop").write_text(f"[Desktop Entry]\nName={name}\nExec={name}\n")
    dock = DockFavourites([apps], tmp_path / "panels", lambda n: f"echo {n}", tmp_path / "db")
    dock.write(["a.desktop", "b.desktop", "c.desktop"])
    assert dock.shown == ("a.desktop", "b.desktop", "c.desktop")
    configs = dock.write(["c.desktop", "a.desktop"])
    entries = sorted(p.name for p in (tmp_path / "panels/dock-applications").iterdir())
    assert entries == ["00-c.desktop", "01-a.desktop"]
    assert configs[1].read_text().count("launcher_item_app") == 2
    assert dock.commands == {"c.desktop": ["c"], "a.desktop": ["a"]}
    assert dock.shows(["c.desktop", "x.desktop", "a.desktop"])
    assert not dock.shows(["a.desktop", "c.desktop"])


def test_a_dconf_write_is_seen_by_one_stat(tmp_path):
    db = tmp_path / "user"
    dock = DockFavourites([tmp_path], tmp_path / "panels", str, db)
    dock.mark_seen()
    assert not dock.changed()  # no database yet, none now
    db.write_bytes(b"one")
    assert dock.changed()
    dock.mark_seen()
    assert not dock.changed()
    fresh = tmp_path / "user.new"  # dconf-service writes a new file and renames it into place
    fresh.write_bytes(b"two")
    os.replace(fresh, db)
    assert dock.changed()
