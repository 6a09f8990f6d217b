"""Progress bars (rich): while collecting (groups closed, statuses, success, steps/s) and while
filling the file cache (files, bytes, speed)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.text import Text

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


class _ByUnit(ProgressColumn):
    """``files`` rows: M/N; ``bytes`` rows: downloaded/total and speed."""

    def __init__(self):
        super().__init__()
        self.count, self.size, self.speed = (
            MofNCompleteColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
        )

    def render(self, task) -> Text:
        if task.fields.get("unit") == "bytes":
            return Text.assemble(self.size.render(task), " ", self.speed.render(task))
        return self.count.render(task)


class CacheProgress:
    """Context manager drawing ``legato osworld cache``: a row of files done (of those to fetch)
    and a row of bytes on disk (of the sizes announced so far). Implements
    :class:`~legato_pipelines.osworld_format.fetch.FetchProgress`."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description:>5}"),
            BarColumn(),
            _ByUnit(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.files = self.progress.add_task("files", total=0, unit="files", note="")
        self.bytes = self.progress.add_task("bytes", total=None, unit="bytes", note="")
        self.expected = 0
        self.failed = 0

    def __enter__(self) -> CacheProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def planned(self, files: int) -> None:
        self.progress.update(self.files, total=files)
        if not files:
            self.progress.update(self.bytes, total=0)

    def expect(self, nbytes: int) -> None:
        self.expected += nbytes
        self.progress.update(self.bytes, total=self.expected)

    def advance(self, nbytes: int) -> None:
        self.progress.advance(self.bytes, nbytes)

    def done(self, result) -> None:
        self.failed += result.status == "failed"
        note = f"[red]{self.failed} failed[/]" if self.failed else ""
        self.progress.update(self.files, advance=1, note=note)
