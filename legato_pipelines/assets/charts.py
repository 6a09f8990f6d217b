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
