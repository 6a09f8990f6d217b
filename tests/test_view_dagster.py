"""Issue 17 in Dagster: two partitions (``step-100`` then ``step-50``) materialized for real on
local desktops with the demo script; the ``rollouts`` materialization links the report and
shows a thumbnail strip of the best and worst rollout, ``profile_summary`` charts success by
task across versions in training order, ``training_samples`` reports the training signal; the
Dagster UI (dagster-webserver, headless Chromium) shows the strip, the link and the chart.
Screenshots of the UI are kept in tests/artifacts/view/."""

from __future__ import annotations

import base64
import io
import os
import shutil
import time
from pathlib import Path

import dagster as dg
import pytest
from PIL import Image

from legato_pipelines.assets import ASSETS, policy_versions
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.rundir import read_typed_records
from tests.view_support import (
    ARTIFACTS,
    REPO,
    REPORT_TEST_MARKS,
    SUITE,
    Browser,
    chromium,
    start_webserver,
    stop,
    subset_tasks,
)

pytestmark = REPORT_TEST_MARKS

TASKS = ["local-term-mkdir", "local-term-rename", "local-edit-append"]
VERSIONS = ["step-100", "step-50"]  # materialized in this order; training order is the reverse


def _latest(instance, asset: str, version: str) -> dict:
    key = next(a.key for a in ASSETS if a.key.to_user_string() == asset)
    [record] = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[version]), limit=1
    ).records
    return record.asset_materialization.metadata


def test_dagster_shows_the_report_strip_and_success_across_versions(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    (home / ".nux").mkdir()
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    tasks = subset_tasks(tmp_path / "tasks.json", TASKS)
    lake = Lake(tmp_path / "lake")
    with (
        ScriptedPolicyServer(flavor="vllm", script=SUITE / "scripts" / "demo.json") as server,
        dg.DagsterInstance.from_config(str(home)) as instance,
    ):
        for version in VERSIONS:
            instance.add_dynamic_partitions(policy_versions.name, [version])
            result = dg.materialize(
                ASSETS,
                partition_key=version,
                instance=instance,
                resources={
                    "policy": PolicyResource(base_url=server.url, model=server.model),
                    "desktops": DesktopPoolResource(backend="local", desktops=2),
                    "lake": LakeResource(root=str(lake.root)),
                },
                run_config={
                    "ops": {
                        "rollout_batch": {
                            "config": {"tasks": str(tasks), "group": 2, "max_steps": 10}
                        }
                    }
                },
            )
            assert result.success

        # rollouts: the report, its link, the strip of the best and the worst rollout
        meta = _latest(instance, "rollouts", "step-50")
        report = Path(meta["report"].value)
        assert report == lake.run_dir("step-50") / "report" / "index.html" and report.is_file()
        assert meta["report_url"].value == report.as_uri()
        strip = meta["rollout_strip"].value
        jpeg = base64.b64decode(strip.split("data:image/jpeg;base64,")[1].split(")")[0])
        with Image.open(io.BytesIO(jpeg)) as im:
            assert im.format == "JPEG" and im.width >= 480 and im.height > 250  # two rows
        records = read_typed_records(lake.run_dir("step-50"))
        assert "**best**" in strip and "**worst**" in strip
        assert "local-term-rename" in strip.split("**worst**")[1]  # the demo script's wrong task
        ids = {r.rollout_id for r in records}
        linked = [part.split(".html")[0].rsplit("/", 1)[1] for part in strip.split("file://")[1:]]
        assert len(linked) == 2 and set(linked) <= ids

        # profile_summary: success by task across the two versions, in training order
        profile = _latest(instance, "profile_summary", "step-50")
        assert profile["versions_charted"].value == ["step-50", "step-100"]
        assert "data:image/png;base64," in profile["success_across_versions_chart"].value
        first = _latest(instance, "profile_summary", "step-100")
        assert first["versions_charted"].value == ["step-100"]  # only itself at the time
        assert (lake.chart_dir("step-50") / "success_across_versions.png").is_file()

        # training_samples: the training signal
        signal = _latest(instance, "training_samples", "step-50")
        assert signal["groups"].value == len(TASKS)
        assert signal["zero_variance_groups"].value == len(TASKS)  # scripted: same answer twice
        assert signal["zero_variance_group_share"].value == 1.0
        assert signal["episode_steps_mean"].value == pytest.approx(
            sum(r.n_steps for r in records) / len(records)
        )
        assert signal["tokens_per_step_mean"].value > 0
        assert "| local-term-rename |" in signal["errors_by_task"].value
        assert "data:image/png;base64," in signal["training_signal_chart"].value
        # SQL: versions in training order by the policy_step column
        order = lake.query("SELECT policy_version FROM profile ORDER BY policy_step").column(
            "policy_version"
        )
        assert order.to_pylist() == ["step-50", "step-100"]

    env = {k: v for k, v in os.environ.items() if not k.startswith("LEGATO_")}
    env["LEGATO_LAKE"] = str(lake.root)
    web, url = start_webserver(home, env, tmp_path / "web.log")
    try:
        page = f"{url}/assets/rollouts?view=events&partition=step-50"
        dom, _ = chromium(
            page, screenshot=ARTIFACTS / "dagster-rollouts.png", size="1400,2200", budget=15000
        )
        for label in (
            "rollout_strip",
            "report_url",
            str(report),
            report.as_uri().replace("%3D", "%3D"),
        ):
            assert label in dom, label
        with Browser((1400, 1500)) as browser:
            for asset, label, kind, shot in (
                ("rollouts", "rollout_strip", "jpeg", "dagster-rollout-strip.png"),
                (
                    "profile_summary",
                    "success_across_versions_chart",
                    "png",
                    "dagster-across-versions.png",
                ),
                ("training_samples", "training_signal_chart", "png", "dagster-training-signal.png"),
            ):
                width = _show_markdown(
                    browser, f"{url}/assets/{asset}?view=events&partition=step-50", label, kind
                )
                assert width > 200, (label, width)  # the image decoded and laid out in the dialog
                time.sleep(1.0)  # the dialog fades in
                browser.screenshot(ARTIFACTS / shot)
    finally:
        stop(web)


SHOW = """(() => {
  const row = [...document.querySelectorAll("tr")].find(
    (r) => r.cells.length > 1 && r.cells[0].textContent.trim() === %r);
  if (!row) return false;
  const button = [...row.querySelectorAll("*")].find(
    (e) => e.children.length === 0 && e.textContent.trim() === "[Show Markdown]");
  if (!button) return false;
  button.click();
  return true;
})()"""
SHOWN = """(() => {
  const img = [...document.querySelectorAll("[role=dialog] img")].find(
    (i) => i.src.startsWith("data:image/%s;base64,"));
  return img && img.complete ? img.naturalWidth : 0;
})()"""


def _show_markdown(browser: Browser, page: str, label: str, kind: str) -> int:
    """Open the asset's latest event, click its ``[Show Markdown]`` for ``label``; return the
    width of the image shown in the dialog."""
    browser.goto(page)
    browser.wait(SHOW % label)
    return browser.wait(SHOWN % kind)
