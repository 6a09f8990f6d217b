"""Small PNG charts for ``profile_summary`` (matplotlib, Agg backend, ~10-20 KB each).

Embedded in markdown metadata as ``data:`` URLs (the Dagster UI renders them) and written
next to the profile partition as files.
"""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import matplotlib

from ..record import Record, as_record

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAX_BARS = 30
"""Above this many tasks, success is shown per domain (or as a histogram of task success)."""


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def markdown_image(png: bytes, alt: str) -> str:
    """Markdown showing ``png`` inline (a base64 ``data:`` URL)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def time_share_chart(time_share: Mapping[str, float], title: str) -> bytes:
    """Horizontal bars: each phase's share of attempt time (fractions, summing to 1)."""
    phases = [p for p, v in time_share.items() if v is not None]
    values = [100.0 * time_share[p] for p in phases]
    fig, ax = plt.subplots(figsize=(5, 0.35 * len(phases) + 0.9))
    ax.barh(phases[::-1], values[::-1], color="#4C72B0")
    for y, v in enumerate(values[::-1]):
        ax.text(v + 0.5, y, f"{v:.1f}%", va="center", fontsize=8)
    ax.set_xlim(0, max(values + [1.0]) * 1.2)
    ax.set_xlabel("% of attempt time")
    ax.set_title(title, fontsize=10)
    return _png(fig)


def success_by_task(
    records: Iterable[Record | Mapping[str, Any]],
) -> dict[str, tuple[float, int, str | None]]:
    """``task_id -> (mean reward, attempts, domain)`` over ``ok``/``truncated`` records (typed
    or JSON dicts)."""
    rewards: dict[str, list[float]] = defaultdict(list)
    domains: dict[str, str | None] = {}
    for r in map(as_record, records):
        if r.final:
            rewards[r.task_id].append(float(r.reward or 0.0))
            domains[r.task_id] = r.domain
    return {t: (sum(v) / len(v), len(v), domains[t]) for t, v in sorted(rewards.items())}


def success_chart(per_task: Mapping[str, tuple[float, int, str | None]], title: str) -> bytes:
    """Success (mean reward) per task; per domain, or a histogram, when there are many tasks."""
    if len(per_task) <= MAX_BARS:
        labels = list(per_task)
        values = [per_task[t][0] for t in labels]
        xlabel = "mean reward (ok + truncated attempts)"
    else:
        by_domain: dict[str, list[float]] = defaultdict(list)
        for success, _, domain in per_task.values():
            by_domain[domain or "(no domain)"].append(success)
        if 1 < len(by_domain) <= MAX_BARS:
            labels = sorted(by_domain)
            values = [sum(by_domain[d]) / len(by_domain[d]) for d in labels]
            xlabel = "mean task success per domain"
        else:
            fig, ax = plt.subplots(figsize=(5, 2.5))
            ax.hist([v[0] for v in per_task.values()], bins=10, range=(0, 1), color="#55A868")
            ax.set_xlabel("task success (mean reward)")
            ax.set_ylabel("tasks")
            ax.set_title(title, fontsize=10)
            return _png(fig)
    fig, ax = plt.subplots(figsize=(5, 0.28 * len(labels) + 0.9))
    ax.barh(labels[::-1], values[::-1], color="#55A868")
    ax.set_xlim(0, 1)
    ax.set_xlabel(xlabel)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(title, fontsize=10)
    return _png(fig)


def success_across_versions_chart(
    per_version: Mapping[str, Mapping[str, tuple[float, int, str | None]]], title: str
) -> bytes:
    """Success by task across policy versions: the mean success per version (a line, versions
    in training order) over a task x version heatmap (per domain above :data:`MAX_BARS`
    tasks). ``per_version``: ``version -> task_id -> (mean reward, attempts, domain)``."""
    from ..versions import sort_versions

    versions = sort_versions(per_version)
    tasks = sorted({t for v in versions for t in per_version[v]})
    rows: dict[str, list[float | None]] = {}
    if len(tasks) <= MAX_BARS:
        for t in tasks:
            rows[t] = [per_version[v][t][0] if t in per_version[v] else None for v in versions]
    else:
        domains = sorted(
            {d or "(no domain)" for v in versions for _, _, d in per_version[v].values()}
        )
        for d in domains:
            row: list[float | None] = []
            for v in versions:
                vals = [s for s, _, dom in per_version[v].values() if (dom or "(no domain)") == d]
                row.append(sum(vals) / len(vals) if vals else None)
            rows[d] = row
    means = []
    for v in versions:
        total = sum(s * n for s, n, _ in per_version[v].values())
        count = sum(n for _, n, _ in per_version[v].values())
        means.append(total / count if count else float("nan"))
    height = 1.6 + 0.24 * len(rows)
    fig, (top, heat) = plt.subplots(
        2,
        1,
        figsize=(max(4.5, 1.0 + 0.55 * len(versions)), height + 1.6),
        gridspec_kw={"height_ratios": [1.6, height]},
    )
    x = list(range(len(versions)))
    top.plot(x, means, marker="o", color="#4C72B0")
    top.set_ylim(-0.05, 1.05)
    top.set_ylabel("success", fontsize=8)
    top.set_xticks(x, versions, fontsize=7)
    top.set_title(title, fontsize=10)
    top.grid(alpha=0.3)
    import numpy as np

    grid = np.array([[np.nan if v is None else v for v in r] for r in rows.values()], dtype=float)
    heat.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0, vmax=1, interpolation="nearest")
    heat.set_xticks(x, versions, fontsize=7, rotation=30 if len(versions) > 6 else 0)
    heat.set_yticks(range(len(rows)), list(rows), fontsize=7)
    if grid.size <= 400:
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                heat.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6)
    fig.tight_layout()
    return _png(fig)


def training_signal_chart(
    rewards: list[float], advantages: list[float], lengths: list[int], tokens: list[int], title: str
) -> bytes:
    """Four histograms of the training signal: rewards and advantages of the graded rollouts,
    episode lengths (steps) and response tokens per step."""
    fig, axes = plt.subplots(2, 2, figsize=(6.4, 4.2))
    panels = [
        (rewards, "reward per rollout", "#55A868"),
        (advantages, "advantage per rollout", "#4C72B0"),
        (lengths, "episode length [steps]", "#8172B2"),
        (tokens, "response tokens per step", "#C44E52"),
    ]
    for ax, (values, label, color) in zip(axes.flat, panels, strict=True):
        if values:
            ax.hist(values, bins=min(20, max(1, len(set(values)))), color=color)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)
