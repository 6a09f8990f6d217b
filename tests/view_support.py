"""Helpers for the report tests: a real local batch of the demo script, and headless Chromium
(Debian's ``chromium``, as tests/test_dagster_webserver.py drives it) dumping a page's DOM
after its scripts ran, its console messages, and screenshots kept as test artifacts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "examples" / "tasks" / "local"
CHROMIUM = shutil.which("chromium")
ARTIFACTS = REPO / "tests" / "artifacts" / "view"
"""Screenshots the report tests take (gitignored), for the author to look at."""
LOCAL_APPS = ("Xvfb", "openbox", "xterm", "l3afpad")
HAVE_DESKTOPS = all(shutil.which(a) for a in LOCAL_APPS)

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
    url: str, *, screenshot: Path | None = None, size: str = "1400,1800"
) -> tuple[str, list[str]]:
    """Load ``url`` in headless Chromium; return the DOM after its scripts ran and the console
    messages it logged; with ``screenshot``, also save a PNG of the page there."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        common = [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}"]
        out = subprocess.run(
            [*common, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            shot = subprocess.run(
                [*common, "--virtual-time-budget=5000", f"--screenshot={screenshot}", url],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    console = [m.group(1) for m in map(_CONSOLE.search, out.stderr.splitlines()) if m]
    return out.stdout, console
