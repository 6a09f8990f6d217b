"""Websites on a real sandboxed local desktop (issue 34): the desktop option ``proxy`` reaches
the desktop's Chromium (``google-chrome``'s ``--proxy-server``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest

from legato_pipelines import DesktopConfig
from legato_pipelines.desktops.server import chrome
from legato_pipelines.desktops.server.desktop import open_local_desktops
from legato_pipelines.tasks import Task
from tests.desktop_local_support import needs_xvfb

pytestmark = [
    needs_xvfb,
    pytest.mark.desktop,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(not chrome.available(), reason="needs chromium (apt-get install chromium)"),
    pytest.mark.skipif(shutil.which("socat") is None, reason="needs socat (apt-get install socat)"),
]

PROXY_PORT = 18888  # OSWorld's own tinyproxy port
#: A stand-in proxy, run inside the desktop: logs each request line, answers a page.
STAND_IN_PROXY = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open("/tmp/proxy.log", "a") as log:
            log.write(self.requestline + "\\n")
        body = b"<html><title>via proxy</title></html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _task() -> Task:
    config = {"id": "web", "instruction": "x", "config": [], "evaluator": {"func": "infeasible"}}
    return Task(task_id="web", domain="chrome", config=config, source="inline")


async def test_the_proxy_setting_reaches_chromium():
    config = DesktopConfig(
        backend="local",
        screen_width=1024,
        screen_height=768,
        options={"network": "none", "proxy": f"http://127.0.0.1:{PROXY_PORT}"},
    )
    (desktop,) = await open_local_desktops(config, 1)
    try:
        await desktop.reset(_task())
        await desktop.client.launch(["python3", "-c", STAND_IN_PROXY, str(PROXY_PORT)])
        await desktop.client.launch(["google-chrome", "http://site.standin.test/page"])
        deadline = time.monotonic() + 60
        while True:
            out = await desktop.client.execute("cat /tmp/proxy.log", shell=True)
            if "site.standin.test" in out["output"]:
                break
            assert time.monotonic() < deadline, "Chromium sent nothing through the proxy"
            await asyncio.sleep(0.5)
        assert "GET http://site.standin.test/page HTTP/1.1" in out["output"]
    finally:
        await desktop.close()
