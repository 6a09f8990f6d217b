"""What the lake assets show a researcher besides row counts: the report and a thumbnail strip
(``rollouts``), success by task across policy versions (``profile_summary``), the training
signal (``training_samples``).
"""

from __future__ import annotations

import base64
import logging
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa

from ..record import ERROR, RETRIED, TRUNCATED, Record
from ..store.export import group_advantages
from ..store.lake import Lake
from ..versions import sort_versions
from ..view import best_and_worst, rollout_strip, write_report
from .charts import markdown_image, success_across_versions_chart, success_by_task
from .charts import training_signal_chart as _signal_chart
from .metadata import number

log = logging.getLogger(__name__)


def report_metadata(run_dir: Path, records: list[Record]) -> dict[str, Any]:
    """Write the batch's HTML report (:func:`~legato_pipelines.view.write_report`, into
    ``<run dir>/report``) and return metadata: ``report`` (its index, a path), ``report_url``
    (``file://`` URL), ``report_s`` and ``rollout_strip`` (markdown: the best and the worst
    graded rollout, first and last screenshots, with links to their pages). A report that
    cannot be written is logged and noted in ``report``; the asset goes on."""
    try:
        report = write_report(run_dir)
    except Exception as exc:  # the lake tables matter more than their report: say, go on
        log.warning("rollouts: the HTML report of %s could not be written: %s", run_dir, exc)
        return {"report": dg.MetadataValue.text(f"not written: {type(exc).__name__}: {exc}")}
    out: dict[str, Any] = {
        "report": dg.MetadataValue.path(str(report.index)),
        "report_url": dg.MetadataValue.url(report.index.as_uri()),
        "report_s": dg.MetadataValue.float(round(report.total_s, 3)),
    }
    best, worst = best_and_worst(records)
    if best is not None and worst is not None:
        rows = (
            [("best", best)]
            if best.rollout_id == worst.rollout_id
            else [
                ("best", best),
                ("worst", worst),
            ]
        )
        jpeg = rollout_strip(run_dir, rows)
        image = (
            f"![best and worst rollouts](data:image/jpeg;base64,{base64.b64encode(jpeg).decode()})\n\n"
            if jpeg is not None
            else ""
        )
        bullets = [
            f"- **{label}**: [{r.task_id} attempt {r.attempt}]({report.rollout_page(r.rollout_id).as_uri()}), "
            f"reward {'n/a' if r.reward is None else f'{r.reward:.2f}'}, {r.n_steps} steps"
            for label, r in rows
        ]
        out["rollout_strip"] = dg.MetadataValue.md(image + "\n".join(bullets))
    return out


def success_across_versions(
    store: Lake, version: str, records: list[Record]
) -> dict[str, dict[str, tuple[float, int, str | None]]]:
    """``version -> task_id -> (mean reward, graded attempts, domain)`` over every version whose
    ``rollouts`` partition is in the lake, with ``version`` itself from ``records`` (its own
    partition may not be written yet)."""
    out: dict[str, dict[str, tuple[float, int, str | None]]] = {}
    others = [v for v in store.versions("rollouts") if v != version]
    if others:
        try:
            table = store.query(
                "SELECT policy_version, task_id, any_value(domain) AS domain, "
                "avg(coalesce(reward, 0)) AS success, count(*) AS n FROM rollouts "
                "WHERE status IN ('ok', 'truncated') GROUP BY policy_version, task_id"
            )
        except Exception as exc:  # the views are being rebuilt by another run: skip others
            log.warning("success across versions: lake query failed (%s); this version only", exc)
            table = pa.table({"policy_version": []})
        for row in table.to_pylist():
            if row["policy_version"] in others:
                out.setdefault(row["policy_version"], {})[row["task_id"]] = (
                    float(row["success"]),
                    int(row["n"]),
                    row["domain"],
                )
    out[version] = success_by_task(records)
    return {v: out[v] for v in sort_versions(out) if out[v]}


def across_versions_metadata(store: Lake, version: str, records: list[Record]) -> dict[str, Any]:
    """``success_across_versions_chart`` (markdown image, also written to the version's chart
    folder as ``success_across_versions.png``, :meth:`Lake.write_chart`) and
    ``versions_charted`` (in training order)."""
    per_version = success_across_versions(store, version, records)
    if not per_version:
        return {}
    png = success_across_versions_chart(per_version, "Success by task across policy versions")
    store.write_chart(version, "success_across_versions.png", png)
    return {
        "success_across_versions_chart": dg.MetadataValue.md(
            markdown_image(png, "success by task across versions")
        ),
        "versions_charted": dg.MetadataValue.json(list(per_version)),
    }


def training_signal(records: list[Record], samples: pa.Table) -> dict[str, Any]:
    """The training signal of a batch as metadata: groups and the share with no reward
    variance (no learning signal), reward / advantage / episode-length / tokens-per-step
    summaries and histograms (``training_signal_chart``), errors and truncations by task."""
    final = [r for r in records if r.final]
    advantages = group_advantages(final)
    groups: dict[str, list[float]] = defaultdict(list)
    for r in final:
        groups[r.group_id or r.task_id].append(float(r.reward or 0.0))
    flat = sum(1 for rewards in groups.values() if max(rewards) - min(rewards) < 1e-12)
    rewards = [float(r.reward or 0.0) for r in final]
    advs = [advantages[r.rollout_id] for r in final if r.rollout_id in advantages]
    lengths = [r.n_steps or len(r.steps) for r in final]
    tokens = (
        [len(ids or []) for ids in samples.column("response_token_ids").to_pylist()]
        if "response_token_ids" in samples.column_names
        else []
    )
    by_task: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        row = by_task[r.task_id]
        row["records"] += 1
        if r.status in (ERROR, RETRIED):
            row[f"{r.status} ({r.error_kind or '?'})"] += 1
        if r.status == TRUNCATED:
            row["truncated"] += 1
        row["parse errors"] += sum(1 for s in r.steps if s.parse_error)
        row["eval errors"] += 1 if r.eval_error else 0
    kinds = sorted({k for row in by_task.values() for k in row if k != "records"})
    lines = ["| task | records | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    shown = sorted(
        by_task.items(), key=lambda kv: -sum(v for k, v in kv[1].items() if k != "records")
    )
    for task, row in shown[:30]:
        lines.append(
            f"| {task} | {row['records']} | " + " | ".join(str(row.get(k, 0)) for k in kinds) + " |"
        )
    if len(shown) > 30:
        lines.append(f"\n{len(shown) - 30} more tasks")
    png = _signal_chart(rewards, advs, lengths, tokens, "Training signal")

    def mean(values: list) -> float | None:
        """The mean, ``None`` for no values."""
        return statistics.fmean(values) if values else None

    return {
        "groups": len(groups),
        "zero_variance_groups": flat,
        "zero_variance_group_share": number(flat / len(groups) if groups else None),
        "reward_mean": number(mean(rewards)),
        "reward_std": number(statistics.pstdev(rewards) if rewards else None),
        "advantage_abs_mean": number(mean([abs(a) for a in advs])),
        "episode_steps_mean": number(mean(lengths)),
        "episode_steps_max": number(max(lengths) if lengths else None),
        "tokens_per_step_mean": number(mean(tokens)),
        "tokens_per_step_p50": number(statistics.median(tokens) if tokens else None),
        "errors_by_task": dg.MetadataValue.md("\n".join(lines)),
        "training_signal_chart": dg.MetadataValue.md(markdown_image(png, "training signal")),
    }
