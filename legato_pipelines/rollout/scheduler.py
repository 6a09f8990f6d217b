"""Groups and the work queue.

A task's GRPO group is ``group`` attempts plus ``ceil(group * oversample)`` extra ones. The
queue is group-major (all attempts of the first task, then the next task's, ...) and re-tries
go to its front, so workers finish groups early and the first groups are usable soonest,
instead of spreading every group thin across the batch. A group closes when ``group`` of its
attempts are ``ok`` or ``truncated``; its queued attempts are then ``skipped`` at once and its
running ones are ``cancelled`` at their next step.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..tasks import Task


@dataclass(eq=False)
class Group:
    """One task's group in this batch."""

    index: int
    task: Task
    group_id: str
    size: int  # attempts that close the group
    finished: int = 0  # ok + truncated records
    closed: bool = False


@dataclass(eq=False)
class Execution:
    """One physical execution of a logical attempt (``group``, ``attempt``)."""

    group: Group
    attempt: int
    execution: int = 0  # 0 for the first execution, +1 per retry
    seed: int = 0
    enqueued_at: float = 0.0
    taken: bool = False  # handed to a worker, or settled (skipped) while queued


@dataclass
class Scheduler:
    """The queue of executions plus group bookkeeping. Used from one event loop (no locks)."""

    queue: deque[Execution] = field(default_factory=deque)
    groups: list[Group] = field(default_factory=list)
    scheduled: int = 0  # logical attempts
    retries: int = 0

    def add_group(
        self,
        group: Group,
        attempts: list[int],
        *,
        seed: int,
        now: float,
        executions: dict[int, int] | None = None,
    ) -> None:
        """Queue ``attempts`` (attempt numbers) of ``group``; ``executions`` gives the next
        execution number per attempt when resuming."""
        self.groups.append(group)
        for attempt in attempts:
            ex = Execution(
                group,
                attempt,
                (executions or {}).get(attempt, 0),
                attempt_seed(seed, group.task.task_id, attempt),
                now,
            )
            self.queue.append(ex)
            self.scheduled += 1

    def next(self) -> Execution | None:
        """The next execution to run, or ``None`` when the queue is empty."""
        while self.queue:
            ex = self.queue.popleft()
            if not ex.taken:
                ex.taken = True
                return ex
        return None

    def next_where(self, wanted: Callable[[Execution], bool]) -> Execution | None:
        """The first queued execution for which ``wanted`` is true, taken out of its place
        (the others keep their order), or ``None`` when there is none."""
        for ex in self.queue:
            if not ex.taken and wanted(ex):
                self.queue.remove(ex)
                ex.taken = True
                return ex
        return None

    def retry(self, ex: Execution, now: float) -> Execution:
        """Queue a new execution of ``ex``'s logical attempt at the front."""
        self.retries += 1
        again = Execution(ex.group, ex.attempt, ex.execution + 1, ex.seed, now)
        self.queue.appendleft(again)
        return again

    def finish(self, group: Group) -> list[Execution]:
        """Count one ok/truncated attempt; if that closes the group, return its queued
        executions (now settled: the caller records them as ``skipped``)."""
        group.finished += 1
        if group.closed or group.finished < group.size:
            return []
        group.closed = True
        settled = []
        for ex in self.queue:
            if ex.group is group and not ex.taken:
                ex.taken = True
                settled.append(ex)
        return settled

    def pending(self) -> int:
        return sum(1 for ex in self.queue if not ex.taken)


def group_attempts(group: int, oversample: float) -> int:
    """Attempts scheduled per task: ``group + ceil(group * oversample)``."""
    return group + math.ceil(group * oversample - 1e-9)


def attempt_seed(seed: int, task_id: str, attempt: int) -> int:
    """A stable 63-bit seed for one logical attempt (same run seed, task and attempt -> same seed)."""
    digest = hashlib.sha256(f"{seed}:{task_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
