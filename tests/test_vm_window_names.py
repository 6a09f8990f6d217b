"""Window names and classes OSWorld's configs look for exist on local desktops (issue 33 part 2).

Every ``activate_window`` / ``close_window`` step (setup and postconfig) of every config in
``tests/data/osworld`` is checked against what local desktops' apps name their windows
(:data:`~legato_pipelines.desktops.server.vm_windows.LOCAL_WINDOWS`); then a real sandboxed
desktop shows Thunderbird's main window under the VM's class ``Mail.thunderbird`` (which six
thunderbird configs close before grading) and Chromium's found as ``Google Chrome``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time

import pytest

from legato_pipelines.desktops.server import chrome, vm_windows
from tests.desktop_local_support import needs_xvfb, server_fixture
from tests.osworld_data import OSWORLD

#: Names whose app local desktops do not have (VS Code is not in Debian; gedit is not
#: installed: the text editor is l3afpad): the verdict refuses those tasks for the app.
NO_LOCAL_APP = {
    "Visual Studio Code",
    "test.py - Visual Studio Code",
    "restaurants.txt (~/Desktop) - gedit",
}


def _window_steps():
    for path in sorted(OSWORLD.glob("*/*.json")):
        config = json.loads(path.read_text())
        if not isinstance(config, dict) or "evaluator" not in config:
            continue
        steps = [*(config.get("config") or []), *(config["evaluator"].get("postconfig") or [])]
        for step in steps:
            if step.get("type") in ("activate_window", "close_window"):
                p = step["parameters"]
                yield (
                    config["id"],
                    p["window_name"],
                    p.get("strict", False),
                    p.get("by_class", False),
                )


def test_every_window_a_config_activates_or_closes_exists_on_a_local_desktop():
    steps = list(_window_steps())
    assert len(steps) > 150  # the configs are there
    missing = {
        name
        for _, name, strict, by_class in steps
        if vm_windows.window_name_problem(name, strict=strict, by_class=by_class)
    }
    assert missing == NO_LOCAL_APP
    # the two the issue found: Thunderbird's class and Chrome's title
    assert vm_windows.window_name_problem("Mail.thunderbird", strict=True, by_class=True) is None
    assert vm_windows.window_name_problem("Google Chrome") is None
    assert vm_windows.window_name_problem("Mail.thunderbird-default", strict=True, by_class=True)


def test_strict_names_need_the_whole_title():
    problem = vm_windows.window_name_problem
    assert problem("SalesRep.xlsx - LibreOffice Calc", strict=True) is None
    assert problem("SalesRep.xlsx - LibreOffice", strict=True)
    assert problem("LibreOffice Calc") is None  # a substring of the fixed text
    assert problem("Budget") is not None  # could only fall in a free part: not evidence


server = server_fixture(1280, 720)


def _found(response) -> bool:
    return response.headers["X-Legato-Window-Found"] == "true"


@needs_xvfb
@pytest.mark.desktop
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)")
@pytest.mark.skipif(
    not (shutil.which("thunderbird") and chrome.available()), reason="needs thunderbird, chromium"
)
async def test_thunderbird_has_the_vms_class_and_chromium_answers_as_google_chrome(server):
    client = server.client()
    try:
        await client.reset()
        await client.launch(["/usr/bin/thunderbird"])
        await client.launch(["google-chrome", "--remote-debugging-port=1337"])
        deadline = time.monotonic() + 90
        while True:
            windows = await client.windows() or []
            classes = {(w["instance"], w["class"]) for w in windows}
            if ("Mail", "thunderbird") in classes and any(c == "Google-chrome" for _, c in classes):
                break
            assert time.monotonic() < deadline, windows
            await asyncio.sleep(0.5)
        activated = await client._request(
            "POST", "/setup/activate_window", kind="setup", json={"window_name": "Google Chrome"}
        )
        assert _found(activated)
        closed = await client._request(
            "POST",
            "/setup/close_window",
            kind="setup",
            json={"window_name": "Mail.thunderbird", "strict": True, "by_class": True},
        )
        assert _found(closed)
        while any(w["class"] == "thunderbird" for w in await client.windows() or []):
            assert time.monotonic() < deadline + 30, "Thunderbird's window did not close"
            await asyncio.sleep(0.5)
    finally:
        await client.reset()
        await client.aclose()
