"""Helpers shared by the benchmarks: a scripted policy server in its own process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

CLICK = (
    'Action: Click the button.\n<tool_call>\n{"name": "computer_use", "arguments": '
    '{"action": "left_click", "coordinate": [500, 400]}}\n</tool_call>'
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def policy_server_process(*args: str):
    """``legato scripted-policy`` in a subprocess on loopback (so its CPU is not the collector's)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", "scripted-policy", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("scripted policy server did not start")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


DONE = (
    'Action: The task is done.\n<tool_call>\n{"name": "computer_use", "arguments": '
    '{"action": "terminate", "status": "success"}}\n</tool_call>'
)
