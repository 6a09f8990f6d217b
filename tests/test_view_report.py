"""Issue 17: ``legato view`` on a real local-desktop batch, opened from disk in headless
Chromium: the index lists every rollout (and filters and sorts), a rollout page shows its
screenshots with the click marker inside the image where the action's screen coordinates put
it (measured on the laid-out page), a group page shows its attempts, no console messages.
Screenshots of the three pages are kept in tests/artifacts/view/."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import orjson
import pytest

from legato_pipelines import read_records
from legato_pipelines.view import safe_name, write_report
from tests.view_support import (
    ARTIFACTS,
    REPORT_TEST_MARKS,
    chromium,
    collect_local,
    subset_tasks,
)

pytestmark = REPORT_TEST_MARKS

TASKS = ["local-term-mkdir", "local-term-rename", "local-edit-append"]
SCREEN = (1280, 720)  # the local backend's screen


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("view")
    return collect_local(root / "run", subset_tasks(root / "tasks.json", TASKS), group=2)


def _srcs(dom: str) -> list[str]:
    return [html.unescape(s) for s in re.findall(r'<img[^>]* src="([^"]+)"', dom)]


def _resolve(page: Path, src: str) -> Path:
    return (page.parent / unquote(urlparse(src).path)).resolve()


def test_report_of_a_real_local_batch_in_chromium(run_dir):
    res = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "view", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    index = run_dir / "report" / "index.html"
    assert str(index) in res.stdout
    records = read_records(run_dir)
    assert len(records) == 2 * len(TASKS)
    ids = {r["rollout_id"] for r in records}

    # the index: every rollout, then filtered by task and status, sorted by reward
    dom, console = chromium(index.as_uri(), screenshot=ARTIFACTS / "index.png")
    assert console == []
    assert set(re.findall(r'<tr data-rollout="([0-9a-f]+)"', dom)) == ids
    assert f"{len(ids)} of {len(ids)} rollouts" in dom
    dom, _ = chromium(index.as_uri() + "?task=local-term-rename")
    shown = re.findall(r'<tr data-rollout="([0-9a-f]+)"', dom)
    assert sorted(shown) == sorted(
        r["rollout_id"] for r in records if r["task_id"] == "local-term-rename"
    )
    dom, _ = chromium(index.as_uri() + "?sort=reward-asc&status=ok")
    order = re.findall(r'<tr data-rollout="([0-9a-f]+)"', dom)
    rewards = {r["rollout_id"]: r["reward"] for r in records}
    assert [rewards[i] for i in order] == sorted(rewards[i] for i in order)
    assert rewards[order[0]] == 0.0 and rewards[order[-1]] == 1.0  # the demo script's wrong task

    # a rollout page: the click on the terminal, drawn where the desktop received it
    clicked = next(
        r for r in records if r["task_id"] == "local-term-rename" and r["steps"][0]["actions"]
    )
    action = clicked["steps"][0]["actions"][0]
    assert action["action"] == "left_click"
    x, y = action["screen"]
    page = run_dir / "report" / "rollouts" / f"{safe_name(clicked['rollout_id'])}.html"
    dom, console = chromium(page.as_uri(), screenshot=ARTIFACTS / "rollout.png", size="1400,1300")
    assert console == []
    srcs = _srcs(dom)
    assert len(srcs) == len(clicked["steps"])  # one screenshot per step, from the run's images/
    for src, step in zip(srcs, clicked["steps"], strict=True):
        assert src.endswith(f"images/{step['observation']}.png")
        assert _resolve(page, src) == (run_dir / "images" / f"{step['observation']}.png").resolve()
    mark = re.search(r'<g class="mark mark-click"[^>]*>', dom).group(0)
    placed = re.search(r'data-placed="([\d.]+),([\d.]+)"', mark)
    assert placed, f"the marker was not laid out over a loaded screenshot: {mark}"
    fx, fy = float(placed.group(1)), float(placed.group(2))
    assert 0 < fx < 1 and 0 < fy < 1  # inside the image
    assert fx == pytest.approx(x / SCREEN[0], abs=0.005) and fy == pytest.approx(
        y / SCREEN[1], abs=0.005
    )
    assert "type: mv ~/draft.md" in dom or "type: cp ~/draft.md" in dom  # typed text as a label
    assert "Rename the file draft.md" in dom  # the instruction
    assert "setup failures" in dom and "evaluator" in dom and "logprobs" in dom

    # a group page: its attempts side by side, first and last screenshots
    group = clicked["group_id"]
    gpage = run_dir / "report" / "groups" / f"{safe_name(group)}.html"
    dom, console = chromium(gpage.as_uri(), screenshot=ARTIFACTS / "group.png", size="1000,900")
    assert console == []
    members = {r["rollout_id"] for r in records if r["group_id"] == group}
    assert set(re.findall(r'<div class="attempt" data-rollout="([0-9a-f]+)"', dom)) == members
    thumbs = _srcs(dom)
    assert len(thumbs) == 2 * len(members)
    for src in thumbs:
        path = _resolve(gpage, src)
        assert path.is_file() and path.stat().st_size < 40_000  # small thumbnails
    assert "no reward variance" in dom  # both attempts of the wrong script scored 0


def test_parse_errors_and_setup_failures_are_highlighted(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("report"))
    lines = (copy / "rollouts.jsonl").read_bytes().splitlines()
    record = orjson.loads(lines[0])
    record["steps"][0]["parse_error"] = "no <tool_call> in the response"
    record["reset"]["setup_failures"] = [
        {"step": 1, "type": "execute", "exit_status": 2, "error": "ls: cannot access 'x'"}
    ]
    lines[0] = orjson.dumps(record)
    (copy / "rollouts.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    report = write_report(copy, self_contained=True)
    page = report.rollout_page(record["rollout_id"]).read_text()
    assert (
        '<div class="parse-error">parse error: no &lt;tool_call&gt; in the response</div>' in page
    )
    assert 'class="setup-failure"' in page and "ls: cannot access" in page
    # self-contained: the screenshots are copied into the report
    src = _srcs(page)[0]
    assert (
        src.startswith("../images/")
        and _resolve(report.rollout_page(record["rollout_id"]), src).is_file()
    )


def test_view_reads_a_lake_version(run_dir, tmp_path):
    from legato_pipelines.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    shutil.copytree(run_dir, lake.run_dir("step-50"), ignore=shutil.ignore_patterns("report"))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "legato_pipelines",
            "view",
            "--lake",
            str(lake.root),
            "--version",
            "step-50",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert (lake.run_dir("step-50") / "report" / "index.html").is_file()
    res = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "view"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "pass a RUN_DIR" in res.stderr


def test_view_serve_serves_the_report_and_the_run_images(run_dir):
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", "view", str(run_dir), "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = None
        for line in proc.stdout:
            if line.startswith("serving: "):
                url = line.split()[1]
                break
        assert url and url.startswith("http://127.0.0.1:"), url
        assert 'id="rollouts"' in httpx.get(url, timeout=10).text
        record = read_records(run_dir)[0]
        page_url = url.replace("index.html", f"rollouts/{safe_name(record['rollout_id'])}.html")
        page = httpx.get(page_url, timeout=10)
        src = _srcs(page.text)[0]
        image = httpx.get(httpx.URL(page_url).join(src), timeout=10)
        assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
