"""The oracle suite: real OSWorld tasks solved by scripted policy actions on real local desktops
(issues 15 and 33).

``examples/tasks/osworld_solved/`` lists OSWorld's own tasks (os, LibreOffice Writer, Calc and
Impress, GIMP, VLC, Chrome, Thunderbird, multi_apps; a few infeasible ones, answered FAIL) with a script of
policy actions each (``scripts/solve.json``); ``run.py`` runs them through ``legato collect``,
answered by the scripted policy server on loopback, once with the scripts and once with a
policy that does nothing (``terminate`` at once). Every task must score 1 solved and 0 doing
nothing: the evaluators grade the script's work, not the setup. The files the tasks download
and the gold files they are compared against are built by ``files.py`` and served from the file
cache, offline.

By default each backend runs :data:`SUBSET`, a few tasks of every domain: 4 min (local) and
5.5 min (osworld) on 2 cores under load 15 (measured with a full run of the suite beside it).
``LEGATO_ORACLE_FULL=1`` runs the whole list, as ``python examples/tasks/osworld_solved/run.py``
does: about 11 and 17 minutes, too long for CI's 45-minute budget of the whole test suite.

Both run at ``legato collect``'s defaults for OSWorld's tasks, as users get them: a 1920x1080
screen and, on the local backend, the ``vm`` session (OSWorld's GNOME look: top bar, dock,
Yaru; docs/local-desktop.md §18). No script depends on the screen's size or the session.

``osworld``: OSWorld's DesktopEnv, SetupController and evaluators in the venv, driving local
desktop servers (``--osworld-provider local``). ``local``: the local backend's own reset,
input and ready waits, with OSWorld's SetupController and evaluators run by its osworld worker.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from legato_pipelines.desktops.registry import get
from legato_pipelines.desktops.task_defaults import OSWORLD_SCREEN, OSWORLD_SESSION

from .osworld_backend_support import needs_desktop_apps, needs_vm_python, osworld_python

ROOT = Path(__file__).resolve().parents[1]
SOLVED = ROOT / "examples" / "tasks" / "osworld_solved"
APPS = ("soffice", "gimp", "vlc", "gnome-terminal", "chromium", "thunderbird")

#: Two or so tasks of every domain, of every kind of solution (terminal commands, LibreOffice
#: keys and menus, an app's preferences dialog, a settings file edited with the app stopped,
#: the setup's own scripts, an infeasible task answered FAIL).
SUBSET = (
    "a4d98375",  # os: gsettings from a terminal
    "6f56bf42",  # os: setup.sh / eval.sh from the file cache, the setup's terminal
    "3ef2b351",  # Writer: centre the heading, save
    "72b810ef",  # Writer: strike-through by Search Commands
    "bb8ccc78",  # Writer: infeasible, FAIL
    "51b11269",  # Calc: sort by the Data menu
    "ce88f674",  # Impress: Slide Properties, portrait
    "d52d6308",  # GIMP: Tab hides the docks
    "7767eef2",  # GIMP: gimprc with GIMP stopped
    "a5bbbcd5",  # VLC: preferences dialog, by Tab and space
    "215dfd39",  # VLC: vlcrc with VLC stopped
    "12086550",  # Chrome: a settings page by URL
    "030eeff7",  # Chrome: Preferences with Chrome stopped
    "2b9493d7",  # multi_apps: the setup's terminal
    "937087b6",  # multi_apps: xdg-mime default
    "3f49d2cc",  # Thunderbird: a menu by keys, the stand-in profile from the file cache
)
FULL = os.environ.get("LEGATO_ORACLE_FULL") == "1"

#: Real desktops and apps, OSWorld's venv (the desktop tests only).
ON_DESKTOPS = [
    pytest.mark.desktop,
    pytest.mark.slow,
    needs_desktop_apps,
    needs_vm_python,
    pytest.mark.skipif(not all(shutil.which(a) for a in APPS), reason=f"needs {', '.join(APPS)}"),
]


def _runner():
    """``examples/tasks/osworld_solved/run.py`` (not a package: loaded by path)."""
    name = "osworld_solved_run"
    if name not in sys.modules:  # registered first: its dataclass looks its module up there
        spec = importlib.util.spec_from_file_location(name, SOLVED / "run.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_the_subset_covers_every_domain_of_the_suite():
    entries = json.loads((SOLVED / "tasks.json").read_text())
    assert len(entries) >= 60
    picked = _runner().select(entries, list(SUBSET))
    assert len(picked) == len(SUBSET)
    assert {e["domain"] for e in picked} == {e["domain"] for e in entries}


@pytest.mark.parametrize(
    "backend", [pytest.param(b, marks=ON_DESKTOPS) for b in ("local", "osworld")]
)
def test_every_oracle_task_scores_one_and_doing_nothing_scores_zero(tmp_path, backend):
    run = _runner()
    entries = run.select(json.loads((SOLVED / "tasks.json").read_text()), [] if FULL else SUBSET)
    collect_args = ["--backend", backend, "--max-steps", "25"]
    if backend == "osworld":
        collect_args += ["--osworld-provider", "local", "--osworld-python", osworld_python()]
    outcomes, _ = run.run_suite(entries, tmp_path, collect_args, desktops=2)

    wrong = {o.task_id: o.problem() for o in outcomes if not o.ok}
    assert not wrong
    # at collect's defaults for OSWorld's tasks, as users get them: nothing pinned by the runner
    expected = {"screen": "{}x{}".format(*OSWORLD_SCREEN)}
    if "session" in get(backend).options.model_fields:
        expected["session"] = OSWORLD_SESSION
    for run_pass in ("solve", "nothing"):
        knobs = json.loads((tmp_path / run_pass / "run.json").read_text())["knobs"]
        assert knobs.get("osworld_defaults") == expected, run_pass
    # a feasible task's script acted, then terminated (an infeasible one answers FAIL at once)
    osworld = ROOT / "tests" / "data" / "osworld"
    for o in outcomes:
        config = json.loads((osworld / o.domain / f"{o.task_id}.json").read_text())
        if config["evaluator"]["func"] != "infeasible":
            assert o.solved["n_steps"] >= 2, o.task_id
