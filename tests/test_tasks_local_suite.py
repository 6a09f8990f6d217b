"""The local task suite and its scripts: consistent with each other and with the harness parser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from legato_pipelines.harness.parse import CoordinateMap, parse_response
from legato_pipelines.osworld_format import classify_task, evaluator_unsupported
from legato_pipelines.tasks import load_tasks

SUITE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "local"


@pytest.fixture(scope="module")
def suite():
    tasks = load_tasks(SUITE / "tasks.json")
    scripts = {
        name: orjson.loads((SUITE / "scripts" / f"{name}.json").read_bytes())["tasks"]
        for name in ("correct", "wrong")
    }
    return tasks, scripts


def parse(text):
    return parse_response(
        text, "stop", variant="qwen3vl", coords=CoordinateMap.relative((1280, 720))
    )


def test_every_task_has_a_correct_and_a_wrong_script(suite):
    tasks, scripts = suite
    assert len(tasks) >= 12
    instructions = [t.instruction for t in tasks]
    for name in ("correct", "wrong"):
        assert sorted(scripts[name]) == sorted(instructions), name
    for t in tasks:
        assert scripts["correct"][t.instruction] != scripts["wrong"][t.instruction], t.task_id


def test_scripts_parse_and_end_with_terminate(suite):
    tasks, scripts = suite
    for t in tasks:
        infeasible = t.evaluator["func"] == "infeasible"
        for name, script in scripts.items():
            steps = [parse(text) for text in script[t.instruction]]
            assert all(s.parse_error is None and s.actions for s in steps), (t.task_id, name)
            assert [s.terminal for s in steps[:-1]] == [None] * (len(steps) - 1)
            want = "fail" if infeasible and name == "correct" else "done"
            assert steps[-1].terminal == want, (t.task_id, name)


def test_suite_covers_three_apps_and_the_required_metrics(suite):
    tasks, _ = suite
    apps = {a for t in tasks for a in classify_task(t).apps}
    assert {"terminal", "text_editor", "libreoffice_calc"} <= apps
    funcs = set()
    for t in tasks:
        f = t.evaluator["func"]
        funcs.update(f if isinstance(f, list) else [f])
        assert evaluator_unsupported(t.evaluator) == [], t.task_id
    assert {
        "infeasible",
        "compare_text_file",
        "check_include_exclude",
        "exact_match",
        "compare_csv",
        "compare_table",
    } <= funcs


def test_build_script_reproduces_the_committed_files(tmp_path):
    before = {
        p.name: p.read_bytes()
        for p in [SUITE / "tasks.json", *sorted((SUITE / "scripts").glob("*.json"))]
    }
    proc = subprocess.run(
        [sys.executable, str(SUITE / "build.py")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    after = {
        p.name: p.read_bytes()
        for p in [SUITE / "tasks.json", *sorted((SUITE / "scripts").glob("*.json"))]
    }
    assert after == before
