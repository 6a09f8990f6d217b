"""Shared pieces of the osworld-backend tests: the OSWorld venv, the local suite, a script runner."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from legato_pipelines.desktops.osworld_worker.install import (
    default_venv,
    install,
    is_installed,
    venv_python,
)
from legato_pipelines.harness.parse import CoordinateMap, parse_response
from legato_pipelines.tasks import load_tasks

SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
APPS = ("Xvfb", "openbox", "xterm", "l3afpad", "wmctrl")

needs_desktop_apps = pytest.mark.skipif(
    not all(shutil.which(a) for a in APPS), reason=f"needs {', '.join(APPS)}"
)


def osworld_python() -> str:
    """The OSWorld interpreter; builds the default venv (core recipe, ~1 min) when missing or
    incomplete (``scripts/osworld_venv.sh`` does it ahead of the tests)."""
    if not is_installed(default_venv()):
        install(default_venv())
    return str(venv_python(default_venv()))


def vm_python_ready() -> bool:
    """The desktop's ``python`` (system PATH) has pyautogui and what it imports on X11
    (``scripts/osworld_venv.sh`` sets it up, as OSWorld's VM image has it)."""
    probe = (
        "import importlib.util, Xlib, pymsgbox, pytweening, tkinter;"
        "assert importlib.util.find_spec('pyautogui')"
    )
    try:
        done = subprocess.run(
            ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "python", "-c", probe],
            capture_output=True,
        )
    except FileNotFoundError:
        return False
    return done.returncode == 0


needs_vm_python = pytest.mark.skipif(
    not vm_python_ready(),
    reason="the desktop's python lacks pyautogui (fix: bash scripts/osworld_venv.sh)",
)


def suite_tasks() -> dict:
    return {t.task_id: t for t in load_tasks(SUITE / "tasks.json")}


def suite_scripts() -> dict[str, dict[str, list[str]]]:
    return {
        n: orjson.loads((SUITE / "scripts" / f"{n}.json").read_bytes())["tasks"]
        for n in ("correct", "wrong")
    }


async def run_script(desktop, task, responses, trace: list[str] | None = None):
    """Drive ``desktop`` through one attempt with scripted Qwen responses; the Evaluation.
    ``trace``: gets one line per wait (what came before it, the Wait), for a failure's message."""
    trace = trace if trace is not None else []
    kind = await desktop.reset(task, seed=0)
    trace.append(f"reset {kind}: {await desktop.wait_after_reset()}")
    coords = CoordinateMap.relative(desktop.screen_size)
    terminal = None
    for text in responses:
        parsed = parse_response(text, "stop", variant="qwen3vl", coords=coords)
        for action in parsed.actions:
            if action.action == "terminate":  # as the engine: it ends the attempt, no act
                continue
            await desktop.act(action)
            wait = await desktop.wait_after_action(action)
            trace.append(f"{action.action} {action.keys or action.text or ''}: {wait}")
        if parsed.terminal:
            terminal = parsed.terminal
            break
    trace.append(f"eval: {await desktop.wait_before_eval()}")
    evaluation = await desktop.evaluate(task, last_action_fail=terminal == "fail")
    return kind, evaluation
