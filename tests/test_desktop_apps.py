"""Every app a local desktop has from Debian (``DESKTOP_APPS``) launches in a sandboxed desktop,
maps its main window within a minute with no first-start window beside it (tips, template
chooser, privacy question: the baseline HOME turns them off), and is gone after the next reset.
Real server, real Xvfb."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from legato_pipelines.desktops.server.apps import DESKTOP_APPS, DesktopApp
from tests.desktop_local_support import needs_xvfb, server_fixture

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
]
#: GIMP's first start with a new profile takes ~6 s on 2 cores, Thunderbird's ~4 s.
LAUNCH_TIMEOUT_S = 60.0
#: How long after the main window the test still looks for other windows (LibreOffice's tip of
#: the day and Impress's template chooser map with the main window, within 0.5 s).
SETTLE_S = 3.0


server = server_fixture(1280, 720)


def app_id(app: DesktopApp) -> str:
    return app.provides if app.command[0] == "libreoffice" else app.command[0]


@pytest.mark.parametrize("app", DESKTOP_APPS, ids=app_id)
async def test_app_launches_and_maps_its_main_window(server, app):
    if not app.installed():
        pytest.skip(f"{app_id(app)} is not installed (apt-get install {app.packages})")
    client = server.client()
    try:
        await client.reset()
        t0 = time.monotonic()
        await client.launch(list(app.command))
        titles: list[str] = []
        while not any(app.title.lower() in title.lower() for title in titles):
            if time.monotonic() - t0 > LAUNCH_TIMEOUT_S:
                log = (Path(server.state) / "apps.log").read_text(errors="replace")[-1500:]
                pytest.fail(
                    f"{app_id(app)}: no window titled *{app.title}* within {LAUNCH_TIMEOUT_S:.0f}"
                    f" s; windows: {titles}; apps.log: {log}"
                )
            await asyncio.sleep(0.1)
            titles = [w["title"] for w in await client.windows()]
        # first-start windows the baseline HOME turns off: the only top-level window is the
        # app's main window (windows.py clients(), through /legato/windows)
        settle = time.monotonic() + SETTLE_S
        while time.monotonic() < settle:
            await asyncio.sleep(0.25)
            windows = [w["title"] for w in await client.windows()]
            assert len(windows) == 1 and app.title.lower() in windows[0].lower(), windows
        if app.provides == "thunderbird":  # the baseline profile's account, not the account hub
            assert windows[0].startswith("Local Folders"), windows
        assert (await client.reset())["kind"] == "fast"
        assert (await client.processes())["task"] == []  # the app and its helpers are gone
        assert await client.windows() == []
    finally:
        await client.aclose()
