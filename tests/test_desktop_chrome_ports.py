"""Two sandboxed desktops with a network of their own (``network: own``) run OSWorld's chrome
launch steps at the same time, unmodified (``--remote-debugging-port=1337`` and ``socat
tcp-listen:9222,fork tcp:localhost:1337``): each has its own 1337 and 9222, reached from the
host on the port its server reports as ``chromium``, and OSWorld's own ``get_open_tabs_info``
(Playwright over CDP, run in the OSWorld venv) sees each desktop's tabs and only those."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time

import httpx
import pytest

from legato_pipelines import DesktopConfig
from legato_pipelines.desktops.server import chrome
from legato_pipelines.desktops.server.desktop import open_local_desktops
from tests.desktop_local_support import needs_xvfb
from tests.osworld_backend_support import osworld_python
from tests.test_desktop_chrome import chrome_task

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(not chrome.available(), reason="needs chromium (apt-get install chromium)"),
    pytest.mark.skipif(shutil.which("socat") is None, reason="needs socat (apt-get install socat)"),
    pytest.mark.skipif(shutil.which("pasta") is None, reason="needs pasta (apt-get install passt)"),
]
CDP_TIMEOUT_S = 30.0
#: OSWorld's getter as its evaluator calls it (env: what it reads of DesktopEnv), per port.
GETTER = """
import json, sys, types
from desktop_env.evaluators.getters import get_open_tabs_info
out = {}
for port in sys.argv[1:]:
    env = types.SimpleNamespace(vm_ip="127.0.0.1", chromium_port=int(port), server_port=0)
    out[port] = get_open_tabs_info(env, {})
print(json.dumps(out))
"""


async def cdp(port: int, path: str, method: str = "GET") -> dict | list:
    """The DevTools HTTP endpoint on the host's ``port`` (polled until Chrome answers)."""
    deadline = time.monotonic() + CDP_TIMEOUT_S
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            try:
                response = await client.request(method, f"http://127.0.0.1:{port}{path}")
                if response.status_code == 200:
                    return response.json()
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"no DevTools answer on host port {port}"
            await asyncio.sleep(0.2)


async def test_two_desktops_run_chrome_tasks_at_once_each_with_its_own_cdp():
    config = DesktopConfig(
        backend="local", screen_width=1024, screen_height=768, options={"network": "own"}
    )
    desktops = await open_local_desktops(config, 2)
    try:
        ports = [d.server.ports["chromium"] for d in desktops]
        assert len(set(ports)) == 2 and chrome.CDP_BRIDGE_PORT not in ports, ports
        assert all(d.server.ports["vlc"] not in ports for d in desktops)
        health = await desktops[0].client.health()
        assert health["sandbox"]["network"] == "own" and health["ports"]["chromium"] == ports[0]
        # both run the configs' two launch steps at the same time: no "Address already in use"
        await asyncio.gather(*(d.reset(chrome_task()) for d in desktops))
        assert [d.setup_failures for d in desktops] == [[], []]
        versions = [await cdp(port, "/json/version") for port in ports]
        assert versions[0]["webSocketDebuggerUrl"] != versions[1]["webSocketDebuggerUrl"]
        for i, port in enumerate(ports):  # a tab of its own in each browser
            await cdp(port, f"/json/new?data:text/html,<title>desktop-{i}</title>", "PUT")
        done = await asyncio.to_thread(
            subprocess.run,
            [osworld_python(), "-c", GETTER, *map(str, ports)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        tabs = json.loads(done.stdout.strip().splitlines()[-1])
        for i, port in enumerate(ports):
            titles = {t["title"] for t in tabs[str(port)]}
            assert f"desktop-{i}" in titles and f"desktop-{1 - i}" not in titles, tabs
        # a task that wrote outside HOME makes the next reset revert the sandbox (new
        # namespaces, a new pasta): the desktop keeps its host port and the next browser
        # answers on it
        client = desktops[0].client
        wrote = await client.execute("echo password | sudo -S touch /etc/legato-x", shell=True)
        assert wrote["returncode"] == 0, wrote
        await desktops[0].reset(chrome_task())
        assert desktops[0].last_reset.get("reverted") == ["etc/legato-x"], desktops[0].last_reset
        assert (await client.health())["ports"]["chromium"] == ports[0]
        again = await cdp(ports[0], "/json/version")
        assert again["webSocketDebuggerUrl"] != versions[0]["webSocketDebuggerUrl"]
    finally:
        await asyncio.gather(*(d.close() for d in desktops))
