"""The report's per-attempt time is the attempt's own (reset + steps + grading): queue time,
which grows with an attempt's place in the collection order, is left out and said so."""

from __future__ import annotations

import html
import json
import re

from legato_pipelines import DesktopConfig, PolicyConfig, collect, read_records
from legato_pipelines.rollout.settings import CollectSettings
from legato_pipelines.tasks import load_tasks
from legato_pipelines.view import write_report
from tests.engine_support import fake_tasks


def test_attempt_time_excludes_queue_time(policy_server, tmp_path):
    run = tmp_path / "run"
    policy = PolicyConfig(
        base_url=policy_server.url, model=policy_server.model, version="v", step_timeout=30
    )
    # one desktop, six attempts: the later ones queue behind the earlier ones
    desktop = DesktopConfig(backend="fake", options={"latency": {"act": 0.05, "reset": 0.05}})
    settings = CollectSettings(group=2, max_steps=2, desktops=1)
    collect(load_tasks(fake_tasks(3)), policy, run, settings=settings, desktop=desktop)
    records = {r["rollout_id"]: r for r in read_records(run)}
    assert max(r["timing"]["queue_s"] for r in records.values()) > 0.3
    report = write_report(run)
    index = report.index.read_text()
    assert ">attempt time [s]</th>" in index and "queue time excluded" in index
    rows = json.loads(
        html.unescape(re.search(r'<script id="rows"[^>]*>(.*?)</script>', index, re.S)[1])
    )
    assert len(rows) == len(records)
    for row in rows:
        timing = records[row["id"]]["timing"]
        assert abs(row["seconds"] - (timing["total_s"] - timing["queue_s"])) < 1e-6, row
    rid, record = next(iter(records.items()))
    page = report.rollout_page(rid).read_text()
    attempt = record["timing"]["total_s"] - record["timing"]["queue_s"]
    assert f"{attempt:.2f} s attempt ({record['timing']['total_s']:.2f} s from enqueue" in page
