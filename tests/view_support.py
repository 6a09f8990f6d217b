"""Helpers for the report tests: a real local batch of the demo script, and headless Chromium
(Debian's ``chromium``, as tests/test_dagster_webserver.py drives it) dumping a page's DOM
after its scripts ran, its console messages, and screenshots kept as test artifacts."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "examples" / "tasks" / "local"
CHROMIUM = shutil.which("chromium")
ARTIFACTS = REPO / "tests" / "artifacts" / "view"
"""Screenshots the report tests take (gitignored), for the author to look at."""
LOCAL_APPS = ("Xvfb", "openbox", "xterm", "l3afpad")
HAVE_DESKTOPS = all(shutil.which(a) for a in LOCAL_APPS)
#: The marks of a report test: real local desktops and Debian's headless Chromium.
REPORT_TEST_MARKS = [
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_DESKTOPS, reason="needs Xvfb and apps"),
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium"),
]

_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]  # fmt: skip
_CONSOLE = re.compile(r":CONSOLE(?:\(\d+\))?:?\d*\] (.*)")


def subset_tasks(path: Path, task_ids: list[str]) -> Path:
    """Write the local suite's tasks ``task_ids`` to ``path``; return it."""
    tasks = [
        t for t in orjson.loads((SUITE / "tasks.json").read_bytes()) if t["task_id"] in task_ids
    ]
    assert len(tasks) == len(task_ids)
    path.write_bytes(orjson.dumps(tasks))
    return path


def collect_local(out: Path, tasks: Path, *, group: int = 2, version: str = "step-50") -> Path:
    """Collect ``tasks`` on two real local desktops with the demo script (``legato collect``
    against the scripted policy server); return the run directory."""
    from legato_pipelines.policy.scripted import ScriptedPolicyServer

    with ScriptedPolicyServer(flavor="vllm", script=SUITE / "scripts" / "demo.json") as server:
        res = subprocess.run(
            [
                sys.executable, "-m", "legato_pipelines", "collect", "--backend", "local",
                "--tasks", str(tasks), "--policy-url", server.url, "--model", server.model,
                "--out", str(out), "--desktops", "2", "--group", str(group), "--max-steps", "10",
                "--version", version, "--json",
            ],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def chromium(
    url: str, *, screenshot: Path | None = None, size: str = "1400,1800", budget: int = 5000
) -> tuple[str, list[str]]:
    """Load ``url`` in headless Chromium; return the DOM after its scripts ran and the console
    messages it logged; with ``screenshot``, also save a PNG of the page there."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        common = [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}"]
        out = subprocess.run(
            [*common, "--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget}", "--dump-dom", url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            shot = subprocess.run(
                [*common, f"--virtual-time-budget={budget}", f"--screenshot={screenshot}", url],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    console = [m.group(1) for m in map(_CONSOLE.search, out.stderr.splitlines()) if m]
    return out.stdout, console


def free_port() -> int:
    """A free TCP port on loopback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_webserver(home: Path, env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    """``dagster-webserver`` on loopback against the repository's ``workspace.yaml`` (own
    session, so :func:`stop` ends it with its children); returns it and its URL once it
    answers."""
    import time

    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            "dagster-webserver",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            str(REPO / "workspace.yaml"),
        ],
        env={**env, "DAGSTER_HOME": str(home)},
        cwd=home,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "webserver did not come up"
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    """Stop a process started in its own session, and its children."""
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


class Browser:
    """Headless Chromium driven over the DevTools protocol (``websockets``): navigate, run
    JavaScript in the page (e.g. click a button), take screenshots. For pages whose content
    appears only after an interaction, which ``--dump-dom`` cannot do."""

    def __init__(self, size: tuple[int, int] = (1400, 1600)):
        self.size = size

    def __enter__(self) -> Browser:
        import json
        import time

        import httpx
        from websockets.sync.client import connect

        assert CHROMIUM is not None
        self._profile = tempfile.TemporaryDirectory()
        port = free_port()
        self._proc = subprocess.Popen(
            [CHROMIUM, *_FLAGS, f"--user-data-dir={self._profile.name}",
             f"--window-size={self.size[0]},{self.size[1]}", f"--remote-debugging-port={port}",
             "--remote-allow-origins=*", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                page = next(t for t in targets if t.get("type") == "page")
                break
            except (httpx.TransportError, StopIteration, json.JSONDecodeError):
                assert time.monotonic() < deadline, "chromium's DevTools did not come up"
                time.sleep(0.2)
        self._stack = contextlib.ExitStack()
        self._ws = self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20)
        )
        self._id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        stop(self._proc)
        self._profile.cleanup()

    def send(self, method: str, params: dict | None = None) -> dict:
        """One DevTools command; its result (events in between are dropped)."""
        import json

        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params or {}}))
        while True:
            message = json.loads(self._ws.recv(timeout=60))
            if message.get("id") == self._id:
                assert "error" not in message, message
                return message["result"]

    def eval(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 30.0):
        """Poll a JavaScript expression until it is truthy; return its value."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for: {expression}"
            time.sleep(0.25)

    def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.send("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete'")

    def screenshot(self, path: Path) -> None:
        """A PNG of the viewport."""
        import base64

        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
