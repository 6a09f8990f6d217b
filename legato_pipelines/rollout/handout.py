"""Desktops prepared ahead: the reset off the critical path (docs/architecture.md §3, issue 18).

A batch runs ``runners`` attempts at once on a pool of desktops. Every desktop that is free
is reset and set up at once for the next queued execution (:func:`~.attempt.prepare`), in the
background; a runner whose attempt ended takes the oldest prepared desktop (queue order, so
the scheduler's group-major order and its front-of-queue retries hold) and waits only for
what is left of that desktop's preparation. With ``spares`` desktops more than runners
(double buffering: ``runners`` in use, ``spares`` being prepared), the next attempt's reset
runs while the policy drives the current one; with no spares a desktop is prepared when it is
freed, that is when its runner asks for the next one: the reset at hand-out. An attempt's
desktop counts as prepared ahead (``timing.reset_ahead``) only when it was ready before the
attempt's runner asked; with no spares a runner can get a desktop another runner freed
shortly before, and waits for the rest of its reset: not ahead.

Which execution a free desktop is prepared for: the queue's front when a runner will wait for
that preparation (fewer preparations that will serve a runner soon, light ones or ended ones,
than runners without a desktop: a heavy app's start still under way serves none); a desktop
prepared *ahead* (a spare) takes the first queued execution of a heavy app instead
(:func:`heavy_task`: LibreOffice, Chrome, GIMP, Thunderbird, VS Code, VLC: a cold start of
2-4 s, longer than a light attempt), one heavy preparation under way at a time, or up to
:data:`HEAVY_STARTS` (one per CPU) side by side when heavy executions are a minority of the
batch (:meth:`Handout.heavy_starts`); the spares beyond it prepare the queue's next
execution. So a heavy app's start begins early enough to end before a runner needs it (with
one spare per runner a LibreOffice start began only one light attempt ahead and sat on the
critical path), heavy attempts move earlier in the batch and the light attempts keep the
queue's order. Why the two regimes (BENCHMARKS.md, issue 18 part 6): a few heavy executions
among many light ones (the local suite: 3 Calc tasks of 15, queued last), started one at a
time, left the last one to start ~8 s into the batch and end it alone (side by side: 0.90x
the wall); when heavy executions are most of the batch (OSWorld's offline tasks: 12 of 18
attempts), starting them side by side takes every spare away from the light minority, whose
resets then sit on the critical path (1.07x the wall with a 1 s model).

A light preparation that has ended and that no runner needs (the others cover every runner
without a desktop) is given up for a queued heavy execution nothing prepares yet, while a
heavy start may begin and heavy executions are a minority of the batch
(:meth:`Handout._idle_for_heavy`): when the runners took the spares' heavy desktops while
their own were being prepared for light attempts, the next heavy start otherwise waited
seconds for a desktop to come back and ended the batch alone (part 8).

Rules the hand-out keeps:

- a desktop is handed out only once its preparation ended; one whose reset or setup failed
  goes out as that execution's desktop failure (phase ``reset``, as a reset at hand-out
  would record it: retried per ``env_retries``) and never reaches the policy; then the
  desktop is recovered (``Desktop.recover``) in the background before it is prepared again;
  a desktop that cannot recover is retired (the others go on);
- an execution whose group closed while its desktop was being prepared is recorded
  ``skipped`` at once; its desktop is released when its reset ends (a reset is never cut in
  the middle: a half-reset desktop would need a full restart) and prepared for the next;
- when the batch is cancelled (Ctrl-C, an error), :meth:`Handout.aclose` cancels and awaits
  every preparation and recovery: none is leaked, no desktop stays held.

Spares may join late (:meth:`Handout.join`): a batch's runners start on the first desktops
up while the spares still start (a desktop's start-up is ~1.5 s of CPU: four at once on two
cores held the first attempt back by seconds); a spare that comes up is prepared like any
free desktop, one that fails to start is left out with a warning.

Used from one event loop (no locks); imports nothing of Dagster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..desktops.base import Desktop
from ..errors import DesktopError
from ..tasks import Task
from .attempt import Prepared, prepare, unexpected
from .scheduler import Execution, Scheduler

log = logging.getLogger("legato_pipelines.collect")


#: Apps (names of :func:`~legato_pipelines.osworld_format.classify.classify_task`) whose cold
#: start takes seconds: LibreOffice 2.2-4.4 s on the 2-core machine (BENCHMARKS.md), Chrome,
#: GIMP, Thunderbird, VS Code and VLC 1.8-4.6 s; a terminal or text editor ~0.4 s.
HEAVY_APPS = frozenset(
    {
        "libreoffice",
        "libreoffice_calc",
        "libreoffice_writer",
        "libreoffice_impress",
        "chrome",
        "gimp",
        "thunderbird",
        "vs_code",
        "vlc",
    }
)


#: Heavy-app preparations under way at once at most (spares taking heavy executions ahead)
#: while heavy executions are a minority of the batch: one per CPU this process may use, as a
#: cold start keeps about one core busy for 2-4 s (LibreOffice: ~1.3 s of CPU); beyond it a
#: spare prepares the queue's next execution. When heavy executions are half of the batch or
#: more, one at a time (:meth:`Handout.heavy_starts`).
HEAVY_STARTS = max(1, len(os.sched_getaffinity(0)))


def heavy_task(task: Task) -> bool:
    """Whether ``task`` involves an app of :data:`HEAVY_APPS` (its ``related_apps``, the apps
    its launch/open steps start: static analysis, nothing runs; ~2 ms)."""
    from ..osworld_format.classify import classify_task

    return bool(set(classify_task(task).apps) & HEAVY_APPS)


@dataclass(eq=False)
class Handed:
    """One execution with the desktop being prepared for it: ``task`` is the preparation (an
    ``asyncio.Task`` giving :class:`~.attempt.Prepared`), ``began`` / ``ended`` its start and
    end (``time.perf_counter()``; ``ended`` is ``None`` while it runs)."""

    ex: Execution
    desktop: Desktop
    began: float  # time.perf_counter() when the preparation began
    task: asyncio.Task | None = None
    ended: float | None = None  # time.perf_counter() when the preparation ended

    def ready_before(self, asked: float) -> bool:
        """Whether the desktop was prepared ahead for a runner that asked at ``asked``: its
        reset, setup and ready wait had all ended by then (``timing.reset_ahead``). A
        preparation still running when the runner asked (another runner's freed desktop,
        with no spares) is not: the runner waited for the rest of it."""
        return self.ended is not None and self.ended <= asked


class Handout:
    """The pool of desktops of one batch and the desktops prepared ahead for its runners.

    ``desktops``: the open desktops (``len(desktops) - runners`` of them are spares);
    ``on_skipped``: called with each execution whose group closed before its hand-out (the
    engine records it ``skipped``). Raises nothing itself; :meth:`take` returns ``None`` when
    there is no work left or no desktop left to do it.
    """

    def __init__(
        self,
        sched: Scheduler,
        desktops: list[Desktop],
        on_skipped: Callable[[Execution], None],
        runners: int | None = None,
    ):
        self.sched = sched
        self.runners = runners or len(desktops)  # attempts at once
        self._heavy: dict[int, bool] = {}  # id(group) -> heavy_task(its task)
        self._heavy_starts: int | None = None  # heavy_starts(), fixed at its first use
        self._heavy_minority = False  # heavy executions < half the batch (heavy_starts())
        self._closing = False  # aclose() began: nothing is prepared any more
        self.on_skipped = on_skipped
        self.free: deque[Desktop] = deque(desktops)
        self.prepared: deque[Handed] = deque()
        self.recovering: dict[int, asyncio.Task] = {}  # id(desktop) -> its recovery
        self.draining: set[asyncio.Task] = set()  # resets of skipped executions, still running
        self.busy = 0  # desktops handed out to runners
        self.waiting: deque[object] = deque()  # runners asking, in the order they asked
        self.retired: list[Desktop] = []
        self.joining = 0  # desktops still starting (join)
        self.joined: list[Desktop] = []  # desktops that joined late: the caller closes them
        self._changed = asyncio.Event()

    def _fill(self) -> None:
        """Prepare every free desktop for the next queued execution (a spare: for the first
        heavy one; module docstring); then give an idle light preparation up for a heavy
        start that nothing prepares yet (:meth:`_idle_for_heavy`). Nothing once
        :meth:`aclose` began."""
        while not self._closing:
            while self.free:
                ex = self._next()
                if ex is None:
                    return
                if ex.group.closed:
                    self.on_skipped(ex)
                    continue
                handed = Handed(ex, self.free.popleft(), time.perf_counter())
                handed.task = asyncio.create_task(
                    self._prepare(handed), name=f"prepare-{handed.desktop.name}"
                )
                handed.task.add_done_callback(self._prepared)
                self.prepared.append(handed)
            if not self._idle_for_heavy():
                return

    def _prepared(self, task: asyncio.Task) -> None:
        """A preparation ended: wake the runners waiting, and look again at what the free
        heavy-start slots could do (an idle light preparation may be given up); not for a
        cancelled one (:meth:`aclose` cancels them and puts their executions back)."""
        self._changed.set()
        if not task.cancelled() and not self._closing and self.sched.pending():
            self._fill()

    def _idle_for_heavy(self) -> bool:
        """Give up one light preparation that has ended and that no runner needs (the other
        preparations cover every runner without a desktop) when a heavy execution is queued
        with no desktop and a heavy start may begin: its execution goes back to the queue's
        front and its desktop is free again, for the heavy start. Without it, when both
        runners' desktops were prepared for light attempts while the spares' heavy starts
        were still under way (the runners then took the heavy ones), the next heavy start
        waited for a desktop to come back ~4 s later and ended the batch alone: the local
        suite's wall took 21 s instead of 17 s in one run of three (BENCHMARKS.md, issue 18
        part 8). Only while heavy executions are a minority of the batch: where they are most
        of it (OSWorld's offline tasks) the light preparations are the scarce ones, and giving
        them up put the ``os`` attempts' resets on the critical path (p50 0.97 s against 0.00 s).
        Returns whether it gave one up."""
        if self.waiting:
            return False  # a runner waits: every preparation may be the one it gets first
        starting = sum(1 for h in self.prepared if not h.task.done() and self._is_heavy(h.ex))
        if starting >= self.heavy_starts() or not self._heavy_minority:
            return False  # where heavy ones are most of the batch, light preparations are scarce
        if self.runners - self.busy > len(self.prepared) - starting - 1:
            return False  # every preparation left is a runner's next desktop
        idle = [
            h
            for h in self.prepared
            if h.task.done()
            and not h.task.cancelled()
            and h.task.result().ready
            and not self._is_heavy(h.ex)
        ]
        if not idle or not any(
            not ex.taken and not ex.group.closed and self._is_heavy(ex) for ex in self.sched.queue
        ):
            return False
        handed = idle[-1]  # the last in queue order: the one needed last
        self.prepared.remove(handed)
        handed.ex.taken = False
        self.sched.queue.appendleft(handed.ex)
        self.free.append(handed.desktop)
        return True

    @staticmethod
    async def _prepare(handed: Handed):
        """:func:`~.attempt.prepare`, noting when it ended in ``handed.ended``."""
        try:
            return await prepare(handed.desktop, handed.ex)
        finally:
            handed.ended = time.perf_counter()

    def _next(self) -> Execution | None:
        """The execution the next free desktop is prepared for."""
        starting = sum(1 for h in self.prepared if not h.task.done() and self._is_heavy(h.ex))
        # no runner waits for it: a heavy app's start still under way serves no runner soon
        ahead = self.runners - self.busy <= len(self.prepared) - starting
        if ahead and starting < self.heavy_starts():
            ex = self.sched.next_where(lambda e: not e.group.closed and self._is_heavy(e))
            if ex is not None:
                return ex
        return self.sched.next()

    def heavy_starts(self) -> int:
        """Heavy preparations a spare may have under way at once: :data:`HEAVY_STARTS` when
        heavy executions are fewer than half of the queued ones, else 1 (module docstring).
        Counted once, at its first use (~2 ms per task to classify, once)."""
        if self._heavy_starts is None:
            queued = [ex for ex in self.sched.queue if not ex.taken]
            heavy = sum(self._is_heavy(ex) for ex in queued)
            self._heavy_minority = 2 * heavy < len(queued)
            self._heavy_starts = HEAVY_STARTS if self._heavy_minority else 1
        return self._heavy_starts

    def _is_heavy(self, ex: Execution) -> bool:
        heavy = self._heavy.get(id(ex.group))
        if heavy is None:
            heavy = self._heavy[id(ex.group)] = heavy_task(ex.group.task)
        return heavy

    async def take(self, asked: float) -> tuple[Handed, Prepared, float, bool] | None:
        """The next execution with its desktop and :class:`Prepared`, once the preparation
        ended, plus the reset on the critical path: seconds from ``asked`` (the runner's
        ``time.perf_counter()`` when its previous attempt ended, or when the batch started) to
        the hand-out, and whether the desktop was ready before ``asked`` (prepared ahead:
        :meth:`Handed.ready_before`). The first
        preparation to end goes out first (queue order among those that ended): a slow
        LibreOffice start does not hold back a terminal that is ready; runners are served in
        the order they asked. ``None`` when the queue is empty and nothing is prepared, or
        when no desktop is left. The desktop is the caller's until :meth:`release`
        (``ran=True``)."""
        turn = object()
        self.waiting.append(turn)
        try:
            while True:
                self._fill()
                self.drop_closed()
                if self.waiting[0] is turn:
                    handed = next((h for h in self.prepared if h.task.done()), None)
                    if handed is not None:
                        self.prepared.remove(handed)
                        self.busy += 1
                        waited = time.perf_counter() - asked
                        return handed, handed.task.result(), waited, handed.ready_before(asked)
                if not self.prepared and (
                    not self.sched.pending()
                    or not (self.busy or self.recovering or self.draining or self.joining)
                ):
                    return None
                # a preparation ends (its done callback), a desktop comes back (release,
                # recover) or the runner ahead in line was served
                self._changed.clear()
                await self._changed.wait()
        finally:
            self.waiting.remove(turn)
            self._changed.set()

    async def join(self, opening: Awaitable[list[Desktop]], n: int) -> None:
        """Add the ``n`` desktops ``opening`` gives once it ends (spares started after the
        batch began); each is prepared for the next queued execution at once, as any free
        desktop. A failed opening is logged and the batch goes on with the desktops it has;
        a cancelled one is the opener's to clean up. The added desktops are in
        :attr:`joined` (the caller closes them)."""
        self.joining += n
        try:
            desktops = await opening
        except Exception as exc:  # noqa: BLE001 - spares are an optimisation, not a must
            log.warning("%d spare desktop(s) did not start, going on without them: %s", n, exc)
            return
        finally:
            self.joining -= n
            self._changed.set()
        self.joined.extend(desktops)
        self.free.extend(desktops)
        self._fill()
        self._changed.set()

    def drop_closed(self) -> None:
        """Settle every prepared execution whose group has closed (``skipped``); a desktop
        whose reset still runs is released when it ends."""
        dropped = [h for h in self.prepared if h.ex.group.closed]
        if not dropped:
            return
        self.prepared = deque(h for h in self.prepared if not h.ex.group.closed)
        for handed in dropped:
            self.on_skipped(handed.ex)
            if handed.task.done():
                self._give_back(handed.desktop, broken=not handed.task.result().ready)
            else:
                self.draining.add(handed.task)
                handed.task.add_done_callback(lambda t, h=handed: self._drained(t, h))

    def _drained(self, task: asyncio.Task, handed: Handed) -> None:
        self.draining.discard(task)
        if not task.cancelled():
            self.release(handed.desktop, broken=not task.result().ready)

    def release(self, desktop: Desktop, *, broken: bool = False, ran: bool = False) -> None:
        """Give ``desktop`` back (``ran``: it was handed out by :meth:`take`); a ``broken``
        one is recovered in the background first. The free desktops are prepared at once."""
        if ran:
            self.busy -= 1
        self._give_back(desktop, broken=broken)
        self.drop_closed()
        self._fill()
        self._changed.set()

    def _give_back(self, desktop: Desktop, *, broken: bool) -> None:
        if broken:
            task = asyncio.create_task(self._recover(desktop), name=f"recover-{desktop.name}")
            self.recovering[id(desktop)] = task
        else:
            self.free.append(desktop)

    async def _recover(self, desktop: Desktop) -> None:
        try:
            await desktop.recover()
        except Exception as exc:  # noqa: BLE001 - a desktop that cannot recover is retired
            error = exc if isinstance(exc, DesktopError) else unexpected(exc)
            log.warning("desktop %s retired: it could not recover (%s)", desktop.name, error)
            self.retired.append(desktop)
        else:
            self.free.append(desktop)
        finally:
            self.recovering.pop(id(desktop), None)
            self._changed.set()
        self._fill()

    async def aclose(self) -> None:
        """Cancel and await every preparation and recovery still running (the batch ended or
        was cancelled); the executions prepared but never handed out go back to the queue's
        front, as not taken (the engine settles what is left in the queue)."""
        self._closing = True
        tasks = [h.task for h in self.prepared] + list(self.recovering.values())
        tasks += list(self.draining)
        for handed in reversed(self.prepared):
            if not handed.ex.group.closed:
                handed.ex.taken = False
                self.sched.queue.appendleft(handed.ex)
        self.prepared.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
