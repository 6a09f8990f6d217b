"""The local suite's scripts on real local desktops (Xvfb + apps): correct scores 1, wrong < 1.

Drives the ``local`` backend through the Desktop protocol with the scripted responses parsed
by the harness parser, one task per app plus an infeasible one (the whole suite: run
``legato collect --backend local`` with ``scripts/correct.json``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.tasks import load_tasks
from tests.osworld_backend_support import run_script

SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"
TASKS = ("local-term-sort", "local-edit-append", "local-calc-edit-cell", "local-term-infeasible")
APPS = ("Xvfb", "openbox", "xterm", "l3afpad", "libreoffice", "wmctrl")

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(not all(shutil.which(a) for a in APPS), reason=f"needs {', '.join(APPS)}"),
]


async def test_correct_scripts_score_one_and_wrong_ones_less():
    config = DesktopConfig(backend="local", options={"prebuild": ["libreoffice"]})
    [desktop] = await open_desktops(config, 1)
    try:
        tasks = {t.task_id: t for t in load_tasks(SUITE / "tasks.json")}
        scripts = {
            n: orjson.loads((SUITE / "scripts" / f"{n}.json").read_bytes())["tasks"]
            for n in ("correct", "wrong")
        }
        for task_id in TASKS:
            task = tasks[task_id]
            trace: list[str] = []
            _, good = await run_script(desktop, task, scripts["correct"][task.instruction], trace)
            if (good.reward, good.error) != (1.0, None):  # what the desktop showed, for CI
                windows = [w["title"] for w in await desktop.client.windows() or []]
                trace += [
                    f"windows: {windows}",
                    f"data.csv: {await desktop.client.file('/home/user/data.csv')!r}",
                ]
            assert (good.reward, good.error) == (1.0, None), (task_id, trace)
            _, bad = await run_script(desktop, task, scripts["wrong"][task.instruction])
            assert bad.reward < 1.0 and bad.error is None, task_id
    finally:
        await desktop.close()
