"""Websites on a real sandboxed local desktop (issue 34): the desktop option ``proxy`` reaches
the desktop's Chromium (``google-chrome``'s ``--proxy-server``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from legato_pipelines import DesktopConfig
from legato_pipelines.desktops.server import chrome
from legato_pipelines.desktops.server.desktop import open_local_desktops
from legato_pipelines.desktops.server.recorder import web_recorder
from legato_pipelines.tasks import Task
from tests.desktop_local_support import RunningServer, needs_xvfb
from tests.web_standin import NAME, TITLE, make_ca, serve_standin

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


def _listen_port(root: int) -> int:
    """The port the web recorder below process ``root`` listens on (its ``-listen`` flag)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if Path(argv[0]).name == "legato-web-recorder":
            return int(argv[argv.index("-listen") + 1].rsplit(":", 1)[1])
        for task in os.listdir(f"/proc/{pid}/task"):
            todo += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    raise AssertionError(f"no legato-web-recorder below {root}")


@pytest.mark.skipif(web_recorder() is None, reason="needs the web venv (scripts/web_venv.sh)")
async def test_a_reset_between_attempts_keeps_the_recorder_and_its_exchanges(tmp_path):
    """The recorder is the server's, not the task's: a reset leaves it running (it was killed
    with SIGKILL, and the attempt's exchanges in its write buffers were lost), and the next
    attempt's start ends it with SIGTERM, archiving what it recorded."""
    ca, cert, key = make_ca(tmp_path / "ca")
    archive = tmp_path / "archive"
    with serve_standin(cert, key) as standin:
        server = RunningServer(
            320,
            240,
            extra_args=("--network", "host", "--web", f"record:{archive}")
            + ("--web-host", f"{NAME}=127.0.0.1:{standin.port}", "--web-ca", str(ca)),
        )
        client = server.client()
        try:
            await client.reset()
            await client.web_begin("task-a")
            port = _listen_port(server.proc.pid)
            page = await client.execute(
                f"curl -sk --proxy http://127.0.0.1:{port} https://{NAME}/page", shell=True
            )
            assert TITLE in page["output"], page
            assert (await client.processes())["task"] == []  # the recorder is not the task's
            reset = await client.reset()
            assert reset["touched_by"] == "requests since the last reset", reset  # a real one
            assert _listen_port(server.proc.pid) == port  # still running
            await client.web_begin("task-b")  # task-a's attempt ends: archived
            assert (archive / "task-a.flows").stat().st_size > 0
            assert any(r.startswith("/page") for r in standin.requests)
        finally:
            await client.aclose()
            server.stop()
