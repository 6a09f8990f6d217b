"""OSWorld's own setup and evaluators on ``--backend local`` (issue 15 part 2), through the
engine: real OSWorld task configs of different setup/metric/getter kinds on a real local
desktop, graded by desktop-env's code in the osworld worker attached to it.

Every task: setup with no recorded failure; an attempt that terminates at once scores 0, an
infeasible one that terminates with failure scores 1; and the rewards equal those of
``--backend osworld --osworld-provider local`` (DesktopEnv driving the same kind of desktop
end to end). The task files are built here (python-docx, python-pptx) and served from a test
file cache under OSWorld's cache names; nothing is downloaded. One task opens Chrome tabs with
OSWorld's ``chrome_open_tabs`` (playwright over CDP) on a page served on loopback and checks
the open tabs through CDP, so it scores 1 at once: the tab is there only if the setup ran.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from legato_pipelines import read_records
from legato_pipelines.desktops.osworld_worker.desktop_grader import stage_task_files
from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.osworld_format.sources import cache_names
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.tasks import load_tasks
from tests.loopback_page import serve_page
from tests.osworld_backend_support import needs_desktop_apps, needs_vm_python, osworld_python
from tests.osworld_data import OSWORLD, REPO_ROOT

pytestmark = [pytest.mark.desktop, pytest.mark.slow, needs_desktop_apps, needs_vm_python]

#: test_all tasks: an os task (sudo mkdir in setup, vm_command_line getter), an infeasible
#: chrome task, an Impress task (download + open, compare_pptx_files with a cloud_file), a
#: Writer task (download + open, compare_docx_files)
TEST_ALL_TASKS = {
    "e0df059f-28a6-4169-924f-b9623e7184cc": "os",
    "3720f614-37fd-4d04-8a6b-76f54f8c222d": "chrome",
    "af23762e-2bfd-4a1d-aada-20fa8de9ce07": "libreoffice_impress",
    "adf5e2c3-64c7-4644-b7b6-d2f0167927e7": "libreoffice_writer",
}
TABS_TASK = "legato-chrome-open-tabs"
TERMINATE = (
    "Action: done.\n<tool_call>\n"
    '{{"name": "computer_use", "arguments": {{"action": "terminate", "status": "{status}"}}}}'
    "\n</tool_call>"
)


@pytest.fixture(scope="module")
def page_url():
    with serve_page("legato tab") as url:
        yield url + "/legato-tab.html"


def _tabs_task(url: str) -> dict:
    """Chrome as OSWorld's chrome tasks start it, then chrome_open_tabs on a loopback page;
    graded by the open tabs' URLs over CDP (getter open_tabs_info, metric is_expected_tabs)."""
    return {
        "task_id": TABS_TASK,
        "domain": "chrome",
        "config": {
            "id": TABS_TASK,
            "instruction": "Look at the open tab.",
            "config": [
                {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
                {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
                {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [url]}},
            ],
            "related_apps": ["chrome"],
            "evaluator": {
                "func": "is_expected_tabs",
                "result": {"type": "open_tabs_info"},
                "expected": {"type": "rule", "rules": {"type": "url", "urls": [url]}},
            },
        },
    }  # fmt: skip


def _build_file(name: str, gold: bool, path: Path) -> None:
    """A real .docx/.pptx for a task file: the gold one differs from the original."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".pptx"):
        from pptx import Presentation

        deck = Presentation()
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = "Forests"
        slide.placeholders[1].text = "Forests cover a third of the land." + (
            " Gold." if gold else ""
        )
        deck.save(path)
    elif name.endswith(".docx"):
        from docx import Document

        doc = Document()
        doc.add_paragraph("Essay writing for university.")
        doc.add_paragraph("Gold paragraph." if gold else "Original paragraph.")
        doc.save(path)
    else:
        raise AssertionError(f"no builder for {name}")


@pytest.fixture(scope="module")
def workload(tmp_path_factory, page_url):
    """(tasks.json, script, file cache, osworld-backend cache root)."""
    root = tmp_path_factory.mktemp("grader")
    entries = [
        {"task_id": t, "domain": d, "config": json.loads((OSWORLD / d / f"{t}.json").read_text())}
        for t, d in TEST_ALL_TASKS.items()
    ] + [_tabs_task(page_url)]
    (root / "tasks.json").write_bytes(orjson.dumps(entries))
    tasks = load_tasks(root / "tasks.json")
    cache = root / "files"
    for task in tasks:
        for file in task_files(task):
            _build_file(
                file.dest,
                gold=file.kind == "cloud_file",
                path=cache / task.task_id / cache_names(file.url, file.dest)[0],
            )
    # the osworld backend's DesktopEnv reads <cache_dir>/desktop-0/<task_id>/ under its names
    for task in tasks:
        stage_task_files(task, cache, root / "osworld-cache" / "desktop-0" / task.task_id)
    script = {
        "tasks": {
            t.instruction: [
                TERMINATE.format(
                    status="failure" if t.evaluator.get("func") == "infeasible" else "success"
                )
            ]
            for t in tasks
        }
    }
    (root / "script.json").write_bytes(orjson.dumps(script))
    return root, tasks


def _collect(root: Path, out: Path, *backend: str) -> dict[str, dict]:
    with ScriptedPolicyServer(flavor="vllm", script=root / "script.json") as server:
        proc = subprocess.run(
            [
                sys.executable, "-m", "legato_pipelines", "collect", *backend,
                "--tasks", str(root / "tasks.json"), "--policy-url", server.url,
                "--model", server.model, "--out", str(out), "--desktops", "1",
                "--group", "1", "--max-steps", "3", "--json",
                # the tab task's page is served on this host's loopback, which only the
                # host's network reaches (the default, auto, gives the batch a network of
                # its own that reaches no host loopback service: docs/sandbox.md §1)
                "--desktop-option", 'network="host"',
            ],
            capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["task_id"]: r for r in read_records(out)}


def test_local_grades_with_osworlds_code_as_the_osworld_backend_does(workload, tmp_path):
    root, tasks = workload
    local = _collect(
        root,
        tmp_path / "local",
        "--backend", "local",
        "--desktop-option", f"cache_dir={json.dumps(str(root / 'files'))}",
    )  # fmt: skip
    expected = {t.task_id: 0.0 for t in tasks}
    expected["3720f614-37fd-4d04-8a6b-76f54f8c222d"] = 1.0  # infeasible + FAIL
    expected[TABS_TASK] = 1.0  # the tab chrome_open_tabs opened is there
    for task_id, record in local.items():
        assert record["status"] == "ok", (task_id, record.get("error"))
        assert not (record["reset"] or {}).get("setup_failures"), (task_id, record["reset"])
        assert record.get("eval_error") is None, (task_id, record.get("eval_error"))
    assert {t: r["reward"] for t, r in local.items()} == expected

    osworld = _collect(
        root,
        tmp_path / "osworld",
        "--backend", "osworld", "--osworld-provider", "local",
        "--osworld-python", osworld_python(),
        "--desktop-option", f"cache_dir={json.dumps(str(root / 'osworld-cache'))}",
        "--desktop-option", f"work_dir={json.dumps(str(tmp_path / 'work'))}",
    )  # fmt: skip
    assert {t: r["reward"] for t, r in osworld.items()} == expected
    assert all(r.get("eval_error") is None for r in osworld.values())
    shutil.rmtree(tmp_path / "work", ignore_errors=True)


async def test_a_run_records_its_grader_and_resumes_only_with_it(tmp_path):
    """run.json's knobs name the grader the rewards came from; a resume under the other one is
    refused before any desktop starts (its records would mix two graders' rewards)."""
    from legato_pipelines import DesktopConfig, PolicyConfig
    from legato_pipelines.errors import ResumeError
    from legato_pipelines.rollout.engine import collect_async

    tasks = load_tasks(REPO_ROOT / "examples" / "tasks" / "local" / "tasks.json")
    one = type(tasks)(tasks=tasks.tasks[:1], task_set="one")
    out = tmp_path / "run"

    def desktop(grader: str) -> DesktopConfig:
        options = {"grader": grader, "osworld_python": osworld_python()}
        return DesktopConfig(backend="local", screen_width=640, screen_height=480, options=options)

    with ScriptedPolicyServer(flavor="vllm") as server:
        policy = PolicyConfig(base_url=server.url, model=server.model)
        await collect_async(
            one, policy, out, desktops=1, desktop=desktop("own"), max_steps=1, group=1
        )
        assert orjson.loads((out / "run.json").read_bytes())["knobs"]["grader"] == "own"
        with pytest.raises(ResumeError, match="grader 'own', not 'osworld'.*grader=own"):
            await collect_async(
                one, policy, out, desktops=1, desktop=desktop("osworld"), max_steps=1, group=1
            )
    assert len(read_records(out)) == 1
