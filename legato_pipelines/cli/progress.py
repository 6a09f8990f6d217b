"""The progress bar shown while collecting (rich): groups closed, statuses, success, steps/s."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..record import is_final


class CollectProgress:
    """Context manager; pass :meth:`on_record` to ``collect(on_record=...)``."""

    def __init__(self, total_groups: int, *, group_size: int = 1, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]groups"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("collect", total=total_groups, stats="")
        self.counts: Counter[str] = Counter()
        self.finished_by_group: Counter[str] = Counter()
        self.closed: set[str] = set()
        self.rewards: list[float] = []
        self.steps = 0
        self.started = time.perf_counter()
        self.group_size = group_size  # ok/truncated attempts that close a group

    def __enter__(self) -> CollectProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def on_record(self, record: dict[str, Any]) -> None:
        status = record["status"]
        self.counts[status] += 1
        self.steps += record.get("n_steps", 0)
        if is_final(status):
            self.rewards.append(record.get("reward") or 0.0)
            self.finished_by_group[record["group_id"]] += 1
            if self.finished_by_group[record["group_id"]] >= self.group_size:
                self.closed.add(record["group_id"])
        elapsed = max(1e-9, time.perf_counter() - self.started)
        success = sum(self.rewards) / len(self.rewards) if self.rewards else 0.0
        statuses = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        self.progress.update(
            self.task,
            completed=len(self.closed),
            stats=f"{statuses} | success {success:.0%} | {self.steps / elapsed:.1f} steps/s",
        )
