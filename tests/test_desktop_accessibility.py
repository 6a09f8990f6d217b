"""OSWorld's ``/accessibility`` on a real sandboxed desktop: the AT-SPI tree of a GTK editor,
gnome-terminal, VLC (Qt) and Chromium (as ``google-chrome``), in the shape OSWorld's server returns, which
OSWorld's own ``get_active_url_from_accessTree`` (run in the OSWorld venv) reads the URL from."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import lxml.etree
import pytest

from legato_pipelines.desktops.server import accessibility, chrome
from tests.desktop_local_support import needs_xvfb, server_fixture
from tests.osworld_backend_support import osworld_python

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(
        bool(accessibility.missing()),
        reason=f"needs AT-SPI (apt-get install {' '.join(accessibility.missing())})",
    ),
    pytest.mark.skipif(
        not (chrome.available() and all(map(shutil.which, ("gnome-terminal", "l3afpad", "vlc")))),
        reason="needs chromium, gnome-terminal, l3afpad and vlc",
    ),
]
TREE_TIMEOUT_S = 60.0
NS = {"st": "https://accessibility.ubuntu.example.org/ns/state",
      "cp": "https://accessibility.ubuntu.example.org/ns/component"}  # fmt: skip
#: OSWorld's getter as its evaluator calls it, with a controller that returns the tree.
GETTER = """
import sys, types
from desktop_env.evaluators.getters import get_active_url_from_accessTree
tree = open(sys.argv[1]).read()
env = types.SimpleNamespace(controller=types.SimpleNamespace(get_accessibility_tree=lambda: tree))
print(get_active_url_from_accessTree(env, {"goto_prefix": ""}))
"""
#: What each app must show: (what is looked for, OSWorld's XPath for it).
EXPECTED = {
    "l3afpad": '//application[@name="l3afpad"]/frame[@name="(Untitled)"]',
    # OSWorld's /terminal reads the terminal this way (its server's get_terminal_output)
    "gnome-terminal": '//application[@name="gnome-terminal-server"]/frame//terminal',
    "chrome": '//application[@name="Google Chrome"]//entry[@name="Address and search bar"]',
    # Qt's bridge, on by QT_ACCESSIBILITY
    "vlc": '//application[@name="vlc"]/frame[@name="VLC media player"]',
}

server = server_fixture(1280, 720)


async def test_accessibility_tree_of_gtk_apps_and_chrome(server, tmp_path):
    client = server.client()
    try:
        await client.reset()
        await client.upload("/home/user/Desktop/page.html", b"<title>A page</title>Hello")
        for argv in (
            ["l3afpad"],
            ["gnome-terminal"],
            [
                "google-chrome",
                "--remote-debugging-port=1337",
                "file:///home/user/Desktop/page.html",
            ],
            ["vlc"],
        ):
            await client.launch(argv)
        deadline = time.monotonic() + TREE_TIMEOUT_S
        while True:
            xml = await client.accessibility()
            tree = lxml.etree.fromstring(xml.encode())
            found = {app: tree.xpath(path, namespaces=NS) for app, path in EXPECTED.items()}
            url = (found["chrome"][-1].text or "") if found["chrome"] else ""
            if all(found.values()) and url.endswith("page.html"):
                break
            assert time.monotonic() < deadline, ({k: len(v) for k, v in found.items()}, url)
            await asyncio.sleep(0.5)
        assert tree.tag == "desktop-frame"
        # OSWorld's node shape: role tags, states and on-screen extents in their namespaces
        (frame,) = tree.xpath(EXPECTED["l3afpad"], namespaces=NS)
        assert frame.get(f"{{{NS['st']}}}showing") == "true"
        x, y = (int(v) for v in frame.get(f"{{{NS['cp']}}}screencoord").strip("()").split(","))
        width, height = (int(v) for v in frame.get(f"{{{NS['cp']}}}size").strip("()").split(","))
        assert 0 <= x < 1280 and 0 <= y < 720 and width > 100 and height > 100
        assert tree.xpath('//application[@name="l3afpad"]//menu[@name="File"]')
        # OSWorld's own getter reads the active tab's URL out of it
        (tmp_path / "tree.xml").write_text(xml)
        done = await asyncio.to_thread(
            subprocess.run,
            [osworld_python(), "-c", GETTER, str(tmp_path / "tree.xml")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == url, done.stdout
        # the apps, the accessibility bus and its registry are the task's: gone after a reset
        assert (await client.reset())["kind"] == "fast"
        assert (await client.processes())["task"] == []
        empty = lxml.etree.fromstring((await client.accessibility()).encode())
        assert empty.tag == "desktop-frame" and not empty.xpath("//frame")
    finally:
        await client.aclose()
