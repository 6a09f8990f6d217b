"""Real OSWorld tasks solved by scripted policy actions on real local desktops (issue 15).

The list ``examples/tasks/osworld_solved/`` (22 tasks: os, LibreOffice Writer, Calc and
Impress, GIMP, VLC, a multi_apps terminal task) runs through ``collect`` on two desktops, one
attempt each, answered by the scripted policy server on loopback from
``scripts/solve.json``; every task must score 1.0. The files the tasks download and the gold
files their evaluators compare against are built here with python-docx, openpyxl and
python-pptx (``files.py``) and served from the file cache, offline. A handful of tasks are run
again with a script that does nothing (``terminate`` at once): each must score 0, so the
evaluators grade the script's work, not the setup.

``osworld``: OSWorld's DesktopEnv, SetupController and evaluators in the venv, driving local
desktop servers (``--osworld-provider local``). ``local``: the local backend's own
reset, input and ready waits, with OSWorld's SetupController and evaluators run by its
osworld worker (the full OSWorld venv of ``scripts/setup.sh``).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect, read_records
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.policy.synthetic import qwen_response
from legato_pipelines.tasks import load_tasks

from .osworld_backend_support import needs_desktop_apps, needs_vm_python, osworld_python

ROOT = Path(__file__).resolve().parents[1]
SOLVED = ROOT / "examples" / "tasks" / "osworld_solved"
OSWORLD = ROOT / "tests" / "data" / "osworld"
APPS = ("soffice", "gimp", "vlc", "gnome-terminal")

#: Doing nothing must score 0 here: the task's starting state is not its goal.
NOTHING = (
    "a4d98375-215b-4a4d-aee9-3d4370fccc41",  # os: auto-lock off until the policy turns it on
    "3ef2b351-8a84-4ff2-8724-d86eae9b842e",  # Writer: heading not centred
    "51b11269-2ca8-4b2a-9163-f21758420e78",  # Calc: rows not sorted
    "ce88f674-ab7a-43da-9201-468d38539e4a",  # Impress: landscape slides
    "d52d6308-ec58-42b7-a2c9-de80e4837b2b",  # GIMP: docks shown
    "a5bbbcd5-b398-4c91-83d4-55e1e31bbb81",  # VLC: minimal view off
)

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.slow,
    needs_desktop_apps,
    needs_vm_python,
    pytest.mark.skipif(not all(shutil.which(a) for a in APPS), reason=f"needs {', '.join(APPS)}"),
]


def _files():
    """``examples/tasks/osworld_solved/files.py`` (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("osworld_solved_files", SOLVED / "files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def desktop_config(backend: str, cache: Path, work: Path, tasks) -> tuple[DesktopConfig, list]:
    """The backend's config with the library-built files in its file cache, and those files.

    ``local`` reads ``<cache>/<task_id>/`` (``legato osworld cache``'s layout); the osworld
    backend gives each desktop its own DesktopEnv cache ``<cache>/desktop-<i>/`` holding
    ``<task_id>/`` under OSWorld's names, so the files go into both desktops' caches.
    """
    fill_cache = _files().fill_cache
    if backend == "local":
        written = fill_cache(cache, tasks)
        return DesktopConfig(backend="local", options={"cache_dir": str(cache)}), written
    written = [path for i in range(2) for path in fill_cache(cache / f"desktop-{i}", tasks)]
    config = DesktopConfig(
        backend="osworld",
        options={
            "osworld_python": osworld_python(),
            "provider": "local",
            "cache_dir": str(cache),
            "work_dir": str(work),
        },
    )
    return config, written


def run(tasks, script, desktop: DesktopConfig, out: Path) -> dict[str, dict]:
    """One attempt per task on two desktops; the record of each task by id."""
    with ScriptedPolicyServer(script=script) as server:
        policy = PolicyConfig(base_url=server.url, model=server.model, version="v1")
        collect(tasks, policy, out, desktops=2, desktop=desktop, group=1, max_steps=15)
    records = read_records(out)
    assert len(records) == len(tasks), [r["status"] for r in records]
    return {r["task_id"]: r for r in records}


@pytest.mark.parametrize("backend", ["osworld", "local"])
def test_every_solved_task_scores_one_and_doing_nothing_scores_zero(tmp_path, backend):
    tasks = load_tasks(SOLVED / "tasks.json", osworld=OSWORLD)
    assert len(tasks) >= 20
    assert len({t.config["related_apps"][0] for t in tasks if t.config.get("related_apps")}) >= 5
    desktop, built = desktop_config(backend, tmp_path / "cache", tmp_path / "work", tasks)
    # download tasks: inputs (and gold files) built with python-docx, openpyxl, python-pptx
    assert {path.suffix for path in built} == {".docx", ".xlsx", ".pptx"}
    assert len({path.parent.name for path in built}) >= 3

    solved = run(tasks, SOLVED / "scripts" / "solve.json", desktop, tmp_path / "solve")
    failed = {
        task_id: (r["status"], r["reward"], r.get("error"), r.get("eval_error"))
        for task_id, r in solved.items()
        if (r["status"], r["reward"]) != ("ok", 1.0)
    }
    assert not failed
    assert all(r["n_steps"] >= 2 for r in solved.values())  # acted, then terminated

    idle = [
        {"task_id": t.task_id, "domain": t.domain, "config": t.config}
        for t in tasks
        if t.task_id in NOTHING
    ]
    assert len(idle) == len(NOTHING)
    stop = qwen_response("Done.", {"action": "terminate", "status": "success"})
    nothing = {"tasks": {t["config"]["instruction"]: [stop] for t in idle}}
    untouched = run(idle, nothing, desktop, tmp_path / "nothing")
    assert {task_id: r["reward"] for task_id, r in untouched.items()} == dict.fromkeys(NOTHING, 0.0)
