"""Between the policy's end and the grade (issue 33, part 4), on real local desktops through the
engine: the evaluator's postconfig steps that OSWorld carries on after are facts on the
attempt's record (a close or an activate that found no window, a command that failed), in the
Parquet rollouts and counted in the profile; and the grader's log (OSWorld's code in its own
process) is kept in the run directory, named by the record, after the batch's work
directories are gone."""

from __future__ import annotations

import re

import orjson
import pyarrow.parquet as pq
import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, read_records
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.rollout.engine import collect_async
from legato_pipelines.store.lake_tables import Lineage, profile_table, rollouts_table
from legato_pipelines.tasks import load_tasks
from legato_pipelines.view import write_report
from tests.desktop_local_support import needs_apps, needs_xvfb
from tests.osworld_backend_support import needs_vm_python, osworld_python

pytestmark = [pytest.mark.desktop, pytest.mark.slow, needs_xvfb, needs_apps]

TASK_ID = "legato-postconfig-facts"
INSTRUCTION = "Leave the terminal as it is."
TERMINATE = (
    "Action: done.\n<tool_call>\n"
    '{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}'
    "\n</tool_call>"
)
#: the postconfig: a window that is there (no fact), two that are not, a failing command
POSTCONFIG = [
    {"type": "activate_window", "parameters": {"window_name": "xterm"}},
    {"type": "close_window", "parameters": {"window_name": "Untitled 1 - LibreOffice Calc"}},
    {"type": "activate_window", "parameters": {"window_name": "Nowhere", "strict": True}},
    {
        "type": "execute",
        "parameters": {"command": ["sh", "-c", "echo postconfig broke >&2; exit 3"]},
    },
    {"type": "execute", "parameters": {"command": ["true"]}},
]


def _task() -> dict:
    return {
        "task_id": TASK_ID,
        "domain": "terminal",
        "config": {
            "id": TASK_ID,
            "instruction": INSTRUCTION,
            "config": [
                {"type": "launch", "parameters": {"command": ["xterm"]}},
                {
                    "type": "execute",
                    "parameters": {
                        "command": "wmctrl -l",
                        "shell": True,
                        "until": {"stdout": "xterm"},
                    },
                },
            ],
            "evaluator": {
                "postconfig": POSTCONFIG,
                "func": "check_include_exclude",
                "result": {"type": "vm_command_line", "command": "echo graded", "shell": True},
                "expected": {"type": "rule", "rules": {"include": ["graded"], "exclude": []}},
            },
        },
    }


def _local(grader: str) -> DesktopConfig:
    options = {"grader": grader}
    if grader == "osworld":
        options["osworld_python"] = osworld_python()
    return DesktopConfig(backend="local", screen_width=800, screen_height=600, options=options)


async def _collect(tmp_path, desktop: DesktopConfig):
    tasks = load_tasks([_task()])
    out = tmp_path / "run"
    script = {"tasks": {INSTRUCTION: [TERMINATE]}}
    with ScriptedPolicyServer(flavor="vllm", script=script) as server:
        policy = PolicyConfig(base_url=server.url, model=server.model)
        summary = await collect_async(
            tasks, policy, out, desktops=1, desktop=desktop, max_steps=2, group=1
        )
    (record,) = read_records(out)
    return out, summary, record


def _check_facts(out, summary, record) -> None:
    assert record["status"] == "ok", record.get("error")
    assert record["reward"] == 1.0  # the facts explain, they do not change the grade
    assert record.get("eval_error") is None
    assert not (record["reset"] or {}).get("setup_failures")  # the setup's steps all worked
    facts = record["postconfig_failures"]
    assert [(f["step"], f["type"]) for f in facts] == [
        (1, "close_window"),
        (2, "activate_window"),
        (3, "execute"),
    ]
    assert facts[0]["error"] == "no window whose title contains 'Untitled 1 - LibreOffice Calc'"
    assert facts[0]["exit_status"] is None
    assert facts[1]["error"] == "no window whose title is 'Nowhere'"
    assert facts[2]["exit_status"] == 3 and "postconfig broke" in facts[2]["error"]

    # counted in the profile (summary.json and the lake's profile row)
    counted = summary["postconfig_failures"]
    assert counted["attempts"] == 1
    assert counted["by_step"] == {
        f"{TASK_ID} step 1 (close_window)": 1,
        f"{TASK_ID} step 2 (activate_window)": 1,
        f"{TASK_ID} step 3 (execute)": 1,
    }
    assert orjson.loads((out / "summary.json").read_bytes())["postconfig_failures"] == counted
    lineage = Lineage("v1", record["task_set"], "run-1")
    assert profile_table(summary, lineage).column("postconfig_failure_attempts").to_pylist() == [1]

    # in the Parquet rollouts, written and read back
    pq.write_table(rollouts_table(read_records(out), lineage), out / "rollouts.parquet")
    (row,) = pq.read_table(out / "rollouts.parquet").to_pylist()
    assert [(f["step"], f["type"], f["exit_status"]) for f in row["postconfig_failures"]] == [
        (1, "close_window", None),
        (2, "activate_window", None),
        (3, "execute", 3),
    ]
    assert row["grader_log"] == record.get("grader_log")


def _check_log(out, record) -> None:
    assert record["grader_log"] == f"grader-logs/{record['rollout_id']}.log"
    text = (out / record["grader_log"]).read_text()
    assert "postconfig step 3 (execute) failed" in text and "postconfig broke" in text
    assert "postconfig step 1 (close_window) failed" in text


@needs_vm_python
async def test_osworlds_grader_records_the_postconfig_and_keeps_its_log(tmp_path):
    out, summary, record = await _collect(tmp_path, _local("osworld"))
    _check_facts(out, summary, record)
    # the grader's log survives the batch (its work directory is gone), named by the record
    _check_log(out, record)
    # the report's rollout page shows the facts and links the log
    page_path = write_report(out).rollout_page(record["rollout_id"])
    page = page_path.read_text()
    assert "no window whose title is &#39;Nowhere&#39;" in page and "postconfig broke" in page
    (href,) = re.findall(r'<a href="([^"]+)">grader\'s log</a>', page)
    assert (page_path.parent / href).resolve() == (out / record["grader_log"]).resolve()


@needs_vm_python
async def test_the_osworld_backend_records_the_same_and_keeps_the_attempts_log(tmp_path):
    """``--backend osworld --osworld-provider local``: DesktopEnv end to end on a local desktop;
    its worker's log holds every attempt of the desktop, the run keeps this attempt's part."""
    options = {
        "osworld_python": osworld_python(),
        "provider": "local",
        "cache_dir": str(tmp_path / "cache"),
        "work_dir": str(tmp_path / "work"),
    }
    earlier = b"osworld-worker ERROR an earlier batch's line\n"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "osworld-0.log").write_bytes(earlier)  # the desktop's log, appended
    config = DesktopConfig(backend="osworld", options=options)
    out, summary, record = await _collect(tmp_path, config)
    _check_facts(out, summary, record)
    _check_log(out, record)
    whole = (tmp_path / "work" / "osworld-0.log").read_bytes()
    kept = (out / record["grader_log"]).read_bytes()
    assert whole.startswith(earlier) and kept in whole and earlier not in kept


async def test_the_own_grader_records_the_same_postconfig_facts(tmp_path):
    out, summary, record = await _collect(tmp_path, _local("own"))
    _check_facts(out, summary, record)
    assert "grader_log" not in record  # the own subset runs in the collector: no log of its own
