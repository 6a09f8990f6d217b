"""A sandboxed desktop's default apps are those of OSWorld's Ubuntu GNOME VM
(``desktops/server/mime_defaults.py``): ``/setup/open_file`` of a PDF opens GNOME's Document
Viewer (evince) through ``xdg-open``, with the window title OSWorld's configs activate
(``<file> — <document title>``); ``xdg-mime`` answers totem for video and evince for PDF, the
user's ``xdg-mime default`` wins over that, and a reset restores the VM's defaults. Real
server, real Xvfb, real apps."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.built_media import pdf
from tests.desktop_local_support import needs_xvfb, server_fixture

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(
        not all(shutil.which(p) for p in ("evince", "totem", "xdg-open")),
        reason="needs evince, totem and xdg-utils (scripts/setup.sh)",
    ),
]
#: vlc task 386dbd0e's lecture note: its setup activates this window (strict) after opening it
TITLE = "6.006 Introduction to Algorithms, Lecture 2: Data Structures"

server = server_fixture(1280, 720)


async def _default(client, mime: str) -> str:
    done = await client.execute(["xdg-mime", "query", "default", mime])
    return done["output"].strip()


async def test_a_pdf_opens_in_evince_with_the_title_osworld_activates(server):
    client = server.client()
    try:
        await client.reset()
        await client.upload("/home/user/Desktop/lecture.pdf", pdf(TITLE, "Lecture 2"))
        await client.open_file("/home/user/Desktop/lecture.pdf", timeout=30)
        windows = await client.windows()
        assert [w["title"] for w in windows] == [f"lecture.pdf — {TITLE}"], windows
        assert windows[0]["class"].lower() == "evince", windows
        await client.activate_window(f"lecture.pdf — {TITLE}", strict=True)
    finally:
        await client.aclose()


async def test_default_apps_are_the_vms_and_a_users_choice_lasts_until_the_reset(server):
    client = server.client()
    try:
        await client.reset()
        assert await _default(client, "application/pdf") == "org.gnome.Evince.desktop"
        for mime in ("video/mp4", "video/x-matroska", "video/webm", "video/x-msvideo"):
            assert await _default(client, mime) == "org.gnome.Totem.desktop", mime
        await client.execute(["xdg-mime", "default", "vlc.desktop", "video/mp4"])
        assert await _default(client, "video/mp4") == "vlc.desktop"
        assert (await client.reset())["kind"] == "fast"  # HOME restored, system untouched
        assert await _default(client, "video/mp4") == "org.gnome.Totem.desktop"
    finally:
        await client.aclose()
