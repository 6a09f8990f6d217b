"""An xlsx whose formulas hold no cached values (written by openpyxl) keeps OSWorld's grade and
gets an evaluator note on the record saying why.

Real parts: workbooks written by openpyxl, put on a real desktop by the task's own setup (an
``execute`` step), graded by ``compare_table`` through the engine on the ``local`` backend
(scripted policy server on loopback) and by OSWorld's own ``compare_table`` in the osworld
backend's worker (provider ``local``). Before the fix the record said reward 0 and nothing
else.
"""

from __future__ import annotations

import base64
import io
import shutil

import openpyxl
import orjson
import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect_async, read_records
from legato_pipelines.desktops import open_desktops
from legato_pipelines.osworld_format.file_notes import UNCACHED_FORMULAS, uncached_formulas
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.tasks import Task
from tests.desktop_local_support import needs_xvfb

pytestmark = [needs_xvfb, pytest.mark.desktop]

DONE = (
    "Action: The task is done.\n<tool_call>\n"
    '{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}\n'
    "</tool_call>"
)


def workbook(formula: bool) -> bytes:
    """price 4 x units 3 in row 2; C2 is ``=A2*B2`` (openpyxl: no cached value) or 12."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["price", "units", "total"])
    sheet.append([4, 3, "=A2*B2" if formula else 12])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def budget_task(task_id: str, formula: bool) -> dict:
    data = base64.b64encode(workbook(formula)).decode()
    write = (
        f"python3 -c \"import base64; open('budget.xlsx', 'wb').write(base64.b64decode('{data}'))\""
    )
    return {
        "id": task_id,
        "instruction": f"Check the budget ({task_id}).",
        "config": [{"type": "execute", "parameters": {"command": write, "shell": True}}],
        "evaluator": {
            "func": "compare_table",
            "result": {"type": "vm_file", "path": "~/budget.xlsx", "dest": "budget.xlsx"},
            "options": {
                "rules": [
                    {
                        "type": "check_cell",
                        "sheet_idx": 0,
                        "coordinate": "C2",
                        "props": {"value": {"method": "approx:0.001", "ref": 12}},
                    }
                ]
            },
        },
    }


def test_uncached_formulas_are_found_in_openpyxl_workbooks(tmp_path):
    path = tmp_path / "b.xlsx"
    path.write_bytes(workbook(formula=True))
    assert uncached_formulas(path) == ["Sheet!C2"]
    path.write_bytes(workbook(formula=False))
    assert uncached_formulas(path) == []


async def test_engine_records_the_note_and_keeps_the_grade(tmp_path):
    tasks = [
        {"task_id": "budget-formula", "config": budget_task("budget-formula", True)},
        {"task_id": "budget-value", "config": budget_task("budget-value", False)},
    ]
    (tmp_path / "tasks.json").write_bytes(orjson.dumps(tasks))
    script = {"tasks": {t["config"]["instruction"]: [DONE] for t in tasks}}
    with ScriptedPolicyServer(flavor="vllm", script=script) as policy:
        summary = await collect_async(
            tmp_path / "tasks.json",
            PolicyConfig(base_url=policy.url, model=policy.model),
            tmp_path / "run",
            desktops=1,
            desktop=DesktopConfig(backend="local"),
            group=1,
            max_steps=2,
        )
    records = {r["task_id"]: r for r in read_records(tmp_path / "run")}
    formula, value = records["budget-formula"], records["budget-value"]
    # OSWorld's grade: compare_table reads cached values, so the uncached C2 is empty -> 0
    assert (formula["reward"], formula.get("eval_error")) == (0.0, None)
    (note,) = formula["eval_notes"]
    assert note.startswith(f"{UNCACHED_FORMULAS}: result budget.xlsx holds 1 formula cell")
    assert "Sheet!C2" in note
    assert (value["reward"], "eval_notes" in value) == (1.0, False)
    assert summary["eval_notes"] == {"attempts": 1, "by_kind": {UNCACHED_FORMULAS: 1}}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wmctrl") is None, reason="needs wmctrl")
async def test_osworld_worker_notes_what_osworlds_compare_table_was_given(tmp_path):
    from tests.osworld_backend_support import osworld_python

    config = DesktopConfig(
        backend="osworld",
        options={
            "osworld_python": osworld_python(),
            "provider": "local",
            "cache_dir": str(tmp_path / "cache"),
            "work_dir": str(tmp_path / "work"),
        },
    )
    [desktop] = await open_desktops(config, 1)
    try:
        for formula, reward in ((True, 0.0), (False, 1.0)):
            task_id = f"budget-{formula}"
            task = Task(task_id, None, budget_task(task_id, formula), "inline")
            await desktop.reset(task)
            evaluation = await desktop.evaluate(task)
            assert (evaluation.reward, evaluation.error) == (reward, None)
            if formula:
                (note,) = evaluation.notes
                assert note.startswith(f"{UNCACHED_FORMULAS}: result budget")
                assert "Sheet!C2" in note
            else:
                assert evaluation.notes == ()
    finally:
        await desktop.close()
