"""Desktops prepared ahead (rollout/handout.py, issue 18): fake desktops with real latencies
and injected faults, a real scripted policy server on loopback, real run directories.

The hand-out rules: a desktop reaches the policy only once its reset, setup and ready wait
ended, never after a failed setup (that attempt is a desktop failure in phase ``reset``, as
before); an attempt whose group closed, or a batch cancelled, while its desktop is being
prepared releases the desktop and leaves no preparation running."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from legato_pipelines import DesktopConfig, PolicyConfig, collect, load_tasks, read_records
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.backends.fake import FakeDesktop
from legato_pipelines.errors import ConfigError, DesktopError
from legato_pipelines.policy.scripted import Latency
from legato_pipelines.rollout import engine, handout
from legato_pipelines.rollout.engine import collect_async
from legato_pipelines.rollout.settings import attached_servers, spare_desktops
from tests.engine_support import fake_tasks
from tests.test_engine_collect import assert_accounted


def policy(server) -> PolicyConfig:
    return PolicyConfig(base_url=server.url, model=server.model, version="step-1")


class Watched(FakeDesktop):
    """A fake desktop that notes, at every call the policy's side makes, whether its reset
    and ready wait had ended and worked (``violations``), and how its resets ended."""

    def __init__(self, config: DesktopConfig, index: int, log: dict):
        super().__init__(config, index)
        self.log = log
        self.state = "idle"  # idle | resetting | failed | ready
        self.delays: list[float] = []

    async def reset(self, task, *, seed=0):
        self.state = "resetting"
        try:
            if self.delays:  # this desktop's reset seconds, one per reset
                await asyncio.sleep(self.delays.pop(0))
            kind = await super().reset(task, seed=seed)
        except asyncio.CancelledError:
            self.log["cancelled_resets"].append(time.time())
            self.state = "idle"
            raise
        except BaseException:
            self.state = "failed"
            raise
        return kind

    async def wait_after_reset(self):
        wait = await super().wait_after_reset()
        self.state = "ready"
        return wait

    async def observe(self, size=None):
        if self.state != "ready":
            self.log["violations"].append((self.name, self.state))
        return await super().observe(size)

    async def act(self, action):
        if self.state != "ready":
            self.log["violations"].append((self.name, self.state))
        return await super().act(action)


def watched_pool(n: int, **options) -> tuple[list[Watched], dict]:
    log = {"violations": [], "cancelled_resets": []}
    config = DesktopConfig(backend="fake", options=options)
    return [Watched(config, i, log) for i in range(n)], log


@pytest.mark.slow
def test_spares_take_the_reset_off_the_critical_path_with_the_same_rewards(policy_server, tmp_path):
    """2 runners + 2 spares against 2 runners alone, same tasks and seeds: the same rewards;
    with spares the next desktop is reset while the policy works (reset 0.4 s, each model call
    0.15 s, 3 steps), so attempts after the first wait far less than a reset for it."""
    policy_server.latency = Latency(0.15)
    tasks = load_tasks(fake_tasks(4))
    runs = {}
    for spares in (0, 2):
        out = tmp_path / f"spares-{spares}"
        summary = collect(
            tasks,
            policy(policy_server),
            out,
            desktops=2,
            spares=spares,
            desktop=DesktopConfig(backend="fake", options={"latency": {"reset": 0.4}}),
            group=2,
            max_steps=3,
        )
        records = read_records(out)
        assert_accounted(records, summary)
        assert summary["knobs"]["spares"] == spares
        runs[spares] = (summary, records)
    (off, off_records), (on, on_records) = runs[0], runs[2]
    rewards = {
        spares: sorted((r["task_id"], r["attempt"], r["reward"]) for r in recs)
        for spares, (_, recs) in runs.items()
    }
    assert rewards[0] == rewards[2]
    assert {r["desktop"] for r in off_records} == {"fake-0", "fake-1"}
    assert {r["desktop"] for r in on_records} == {"fake-0", "fake-1", "fake-2", "fake-3"}
    # without spares every attempt waits a whole reset (0.4 s), never prepared ahead
    for r in off_records:
        assert r["timing"]["reset_ahead"] is False
        assert r["timing"]["reset_critical_s"] >= 0.39
    # with them: the first two attempts per runner... all 4 desktops reset at once at the
    # start; later attempts find their desktop ready
    ahead = [r for r in on_records if r["timing"]["reset_ahead"]]
    assert len(ahead) >= 4
    assert all(r["timing"]["reset_critical_s"] < 0.2 for r in ahead)
    assert all(r["timing"]["reset_s"] >= 0.39 for r in on_records)  # the reset's own time
    critical_off, critical_on = (s["reset_critical"]["overall"] for s in (off, on))  # the profile
    assert critical_off["n"] == critical_on["n"] == 8
    assert critical_off["ahead"] == 0.0 and critical_on["p50"] < 0.2 <= critical_off["p50"]
    assert set(on["reset_critical"]["by_domain"]) == {"-"}  # inline tasks have no domain


def test_without_spares_no_attempt_claims_a_desktop_prepared_ahead(policy_server, tmp_path):
    """--spares 0 on 2 runners whose desktops reset at different speeds: a runner may get the
    desktop another runner freed (its reset began before this runner asked), but it still
    waited for the rest of that reset, so ``reset_ahead`` (ready before the runner asked)
    stays false: only a spare's work counts as prepared ahead."""
    policy_server.latency = Latency(0.15)
    delays = {"fake-0": [1.0, 0.1], "fake-1": [0.1, 2.0]}

    async def run():
        pool, log = watched_pool(2)
        for d in pool:
            d.delays = list(delays[d.name])
        summary = await collect_async(
            load_tasks(fake_tasks(2)),
            policy(policy_server),
            tmp_path,
            desktop_pool=pool,
            spares=0,
            group=2,
            max_steps=3,
        )
        return summary, log

    summary, log = asyncio.run(run())
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["knobs"]["spares"] == 0 and log["violations"] == []
    timings = [r["timing"] for r in records]
    # the runner that asked after fake-1's 2 s reset began got it: part of it was off its path
    assert any(t["reset_critical_s"] < t["reset_s"] - 0.5 for t in timings), timings
    assert all(t["reset_ahead"] is False for t in timings), timings
    assert summary["reset_critical"]["overall"]["ahead"] == 0.0


def test_a_desktop_is_handed_out_only_ready_and_never_after_a_failed_setup(policy_server, tmp_path):
    """Resets that fail 30% of the time on 2 runners + 2 spares: the policy's side never
    touches a desktop that is resetting or whose reset failed; each failure is that attempt's
    desktop failure in phase ``reset`` (retried, recovered), exactly as without spares."""
    policy_server.latency = Latency(0.02)
    pool, log = watched_pool(
        4,
        latency={"reset": {"dist": "uniform", "low": 0.05, "high": 0.3}},
        faults={"reset_failure": 0.3},
        seed=5,
    )
    summary = collect(
        load_tasks(fake_tasks(6)),
        policy(policy_server),
        tmp_path,
        desktop_pool=pool,
        spares=2,
        group=2,
        env_retries=3,
        max_steps=3,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert log["violations"] == []
    failed = [r for r in records if r["error"] and r["error"]["phase"] == "reset"]
    assert failed, "the seed gives reset failures"
    for r in failed:
        assert r["status"] in ("retried", "error") and r["n_steps"] == 0
        assert r["error"]["type"] == "reset" and r["reset"] is None
    # a failed reset's desktop is recovered before it is prepared again
    assert sum(d.recoveries for d in pool) == len(failed)
    assert summary["knobs"]["desktops"] == 2 and summary["knobs"]["spares"] == 2


def test_group_closed_while_its_desktop_is_prepared_releases_the_desktop(policy_server, tmp_path):
    """Group 1 of 3 attempts per task, 1 runner + 2 spares. Task 0's first attempt (fast reset)
    closes its group while the spares still reset for its other two attempts (1 s): those are
    ``skipped`` at once, and their desktops, released when their resets end, are prepared for
    task 1, whose attempt runs on one of them long before fake-0's own slow reset (3 s) ends.
    Nothing is left running after the batch."""
    policy_server.latency = Latency(0.3)
    delays = {"fake-0": [0.05, 3.0, 3.0, 3.0], "fake-1": [1.0], "fake-2": [1.0]}

    async def run():
        pool, log = watched_pool(3)
        for d in pool:
            d.delays = delays[d.name]
        summary = await collect_async(
            load_tasks(fake_tasks(2)),
            policy(policy_server),
            tmp_path,
            desktop_pool=pool,
            spares=2,
            group=1,
            oversample=2.0,
            max_steps=1,
        )
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return summary, log, leftover

    summary, log, leftover = asyncio.run(run())
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert leftover == []  # no preparation, recovery or runner outlives the batch
    assert log["violations"] == []
    # no reset was cut while the batch ran: only fake-0's last one, once it was over
    assert all(t > max(r["ended_at"] for r in records) for t in log["cancelled_resets"])
    first = [r for r in records if r["task_id"] == "fake-000"]
    assert Counter(r["status"] for r in first) == {"ok": 1, "skipped": 2}
    ok = next(r for r in first if r["status"] == "ok")
    assert ok["desktop"] == "fake-0"
    for r in first:
        if r["status"] == "skipped":  # at once, not after the spares' 1 s resets
            assert r["ended_at"] - ok["ended_at"] < 0.5 and r["desktop"] is None
    second = next(r for r in records if r["task_id"] == "fake-001" and r["status"] == "ok")
    assert second["desktop"] in ("fake-1", "fake-2")  # a released spare, prepared again
    assert second["ended_at"] - ok["ended_at"] < 2.0  # fake-0's 3 s reset did not hold it


def test_a_cancelled_batch_cancels_its_preparations(policy_server, tmp_path):
    """Ctrl-C (the batch's task cancelled) while spares are resetting: every preparation is
    cancelled and awaited; no task of the batch is left; finished records are kept."""

    async def run():
        pool, log = watched_pool(3, latency={"reset": 3.0})
        batch = asyncio.create_task(
            collect_async(
                load_tasks(fake_tasks(3)),
                policy(policy_server),
                tmp_path,
                desktop_pool=pool,
                spares=2,
                group=1,
                max_steps=1,
            )
        )
        await asyncio.sleep(1.0)  # all three desktops are resetting now
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return log, leftover

    log, leftover = asyncio.run(run())
    assert leftover == []
    assert len(log["cancelled_resets"]) == 3  # the runner's and both spares'
    assert read_records(tmp_path) == []


def test_desktop_failures_and_retries_keep_working_with_spares(policy_server, tmp_path):
    """Crashes during actions (10%) on 2 runners + 2 spares: every logical attempt still ends
    in exactly one final record, crashed desktops recover in the background."""
    summary = collect(
        load_tasks(fake_tasks(8)),
        policy(policy_server),
        tmp_path,
        desktops=2,
        spares=2,
        desktop=DesktopConfig(backend="fake", options={"faults": {"crash": 0.1}, "seed": 2}),
        group=2,
        env_retries=5,
        max_steps=4,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert summary["env_failures"] > 0 and summary["counts"]["error"] == 0


def test_spares_default_on_for_local_desktops_only():
    assert spare_desktops(None, desktops=2, backend="local") == 2
    assert spare_desktops(None, desktops=1, backend="local") == 0  # off for a single desktop
    assert spare_desktops(None, desktops=4, backend="fake") == 0
    assert spare_desktops(None, desktops=4, backend="osworld") == 0
    assert spare_desktops(None, desktops=2, backend="local", attached=2) == 0  # by URL
    assert spare_desktops(3, desktops=1, backend="osworld") == 3


def test_desktops_by_url_need_one_server_per_runner_and_spare(policy_server, tmp_path):
    """Two servers by URL, --desktops 2 --spares 1: three are needed. The batch says so, in
    the user's terms (runners + spares), before anything runs or is written; option ``local``
    (desktops started here besides the URLs) counts too."""
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert spare_desktops(1, desktops=2, backend="local", attached=3) == 1
    assert spare_desktops(0, desktops=2, backend="local", attached=2) == 0
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as caught:
        collect(
            load_tasks(fake_tasks(2)),
            policy(policy_server),
            out,
            desktops=2,
            spares=1,
            desktop=DesktopConfig(backend="local", options={"urls": urls}),
        )
    message = str(caught.value)
    assert "lists 2 server(s), but 2 desktop(s) (--desktops) + 1 spare(s) (--spares) need 3" in (
        message
    )
    assert "fix: list 3 URLs, or lower --desktops/--spares" in message
    assert not out.exists()
    with pytest.raises(ConfigError, match="need 3"):
        spare_desktops(1, desktops=2, backend="local", attached=2)
    assert attached_servers({"urls": urls, "local": 1}) == 3
    assert attached_servers({"local": 1}) == 0  # no urls: every desktop is started here


def test_a_batch_cut_mid_way_with_spares_resumes_without_losing_or_doubling(
    policy_server, tmp_path
):
    """A batch with spares cancelled after its third record (desktops being prepared ahead
    for queued attempts that have no record yet), then resumed: the records written are kept
    as they were, every logical attempt ends in exactly one final record."""
    policy_server.latency = Latency(0.05)
    batch = dict(
        tasks=load_tasks(fake_tasks(5)),
        policy=policy(policy_server),
        out=tmp_path,
        desktops=2,
        spares=2,
        desktop=DesktopConfig(backend="fake", options={"latency": {"reset": 0.2}}),
        group=2,
        max_steps=2,
    )

    async def cut():
        enough, seen = asyncio.Event(), []
        running = asyncio.create_task(
            collect_async(
                **batch,
                on_record=lambda r: seen.append(r) if len(seen) < 2 else enough.set(),
            )
        )
        await enough.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(cut())
    kept = (tmp_path / "rollouts.jsonl").read_bytes()
    assert 3 <= len(kept.splitlines()) < 10
    summary = collect(**batch)
    assert (tmp_path / "rollouts.jsonl").read_bytes().startswith(kept)
    assert_accounted(read_records(tmp_path), summary)


class SlowSpares:
    """``open_desktops`` of the engine, with the late opening (``first > 0``: the spares)
    taking ``delay`` seconds first, or failing with ``fail``; notes what was opened, cancelled
    and closed. The desktops are the real fake backend's."""

    def __init__(self, delay: float = 0.0, fail: BaseException | None = None):
        self.delay, self.fail = delay, fail
        self.opened: list[tuple[float, list[str]]] = []
        self.cancelled: list[float] = []
        self.closed: list[str] = []

    async def __call__(self, config, n, first=0):
        if first:
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled.append(time.time())
                raise
            if self.fail is not None:
                raise self.fail
        desktops = await open_desktops(config, n, first)
        for d in desktops:
            d.close = lambda d=d: self._closed(d)
        self.opened.append((time.time(), [d.name for d in desktops]))
        return desktops

    async def _closed(self, desktop) -> None:
        self.closed.append(desktop.name)


def test_runners_start_before_their_spares_are_up_and_the_spares_join(
    policy_server, tmp_path, monkeypatch
):
    """2 runners + 2 spares whose start takes 1 s: the first attempts start on the runners'
    desktops at once, the spares join when up and run attempts of the same batch; every
    desktop is closed at the end."""
    policy_server.latency = Latency(0.1)
    opener = SlowSpares(delay=1.0)
    monkeypatch.setattr(engine, "open_desktops", opener)
    summary = collect(
        load_tasks(fake_tasks(8)),
        policy(policy_server),
        tmp_path,
        desktops=2,
        spares=2,
        desktop=DesktopConfig(backend="fake", options={"latency": {"reset": 0.2}}),
        group=2,
        max_steps=3,
    )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert [names for _, names in opener.opened] == [["fake-0", "fake-1"], ["fake-2", "fake-3"]]
    spares_up = opener.opened[1][0]
    first = min(records, key=lambda r: r["started_at"])
    assert spares_up - first["started_at"] > 0.8  # the batch did not wait for the spares
    assert {r["desktop"] for r in records} == {"fake-0", "fake-1", "fake-2", "fake-3"}
    assert all(
        r["started_at"] >= spares_up for r in records if r["desktop"] in ("fake-2", "fake-3")
    )
    assert sorted(opener.closed) == ["fake-0", "fake-1", "fake-2", "fake-3"]
    assert summary["knobs"]["spares"] == 2 and summary["success_rate"] is not None


def test_spares_that_fail_to_start_leave_the_batch_to_its_runners(
    policy_server, tmp_path, monkeypatch, caplog
):
    """The spares' start fails: a warning, and the batch runs every attempt on the runners'
    desktops (a spare is an optimisation, its failure no batch failure)."""
    policy_server.latency = Latency(0.02)
    opener = SlowSpares(delay=0.2, fail=DesktopError("2 of 2 desktop servers failed", kind="crash"))
    monkeypatch.setattr(engine, "open_desktops", opener)
    with caplog.at_level("WARNING", logger="legato_pipelines.collect"):
        summary = collect(
            load_tasks(fake_tasks(4)),
            policy(policy_server),
            tmp_path,
            desktops=2,
            spares=2,
            desktop=DesktopConfig(backend="fake", options={"latency": {"reset": 0.1}}),
            group=2,
            max_steps=2,
        )
    records = read_records(tmp_path)
    assert_accounted(records, summary)
    assert Counter(r["status"] for r in records) == {"ok": 8}
    assert {r["desktop"] for r in records} == {"fake-0", "fake-1"}
    assert "spare desktop(s) did not start" in caplog.text
    assert sorted(opener.closed) == ["fake-0", "fake-1"]


def test_a_batch_that_ends_before_its_spares_are_up_cancels_their_start(
    policy_server, tmp_path, monkeypatch
):
    """Three one-step attempts on 2 runners end long before the spare's 5 s start: its start
    is cancelled (the opener stops what it started) and nothing of the batch outlives it."""
    policy_server.latency = Latency(0.0)
    opener = SlowSpares(delay=5.0)
    monkeypatch.setattr(engine, "open_desktops", opener)

    async def run():
        t0 = time.time()
        summary = await collect_async(
            load_tasks(fake_tasks(3)),
            policy(policy_server),
            tmp_path,
            desktops=2,
            spares=2,
            desktop=DesktopConfig(backend="fake"),
            group=1,
            max_steps=1,
        )
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return summary, leftover, time.time() - t0

    summary, leftover, wall = asyncio.run(run())
    assert leftover == []
    assert wall < 4.0
    assert len(opener.cancelled) == 1  # one spare (3 attempts: 2 runners + 1), cut
    assert [names for _, names in opener.opened] == [["fake-0", "fake-1"]]
    assert_accounted(read_records(tmp_path), summary)


def light_and_calc(light: int, calc: int, late: int = 0) -> list[dict]:
    """Task entries: ``light`` light tasks, ``calc`` LibreOffice Calc tasks (heavy: their
    ``related_apps``), then ``late`` light ones (all succeed)."""
    return (
        fake_tasks(light, success=1.0)
        + [
            {**t, "config": {**t["config"], "related_apps": ["libreoffice_calc"]}}
            for t in fake_tasks(calc, success=1.0, prefix="calc")
        ]
        + (fake_tasks(late, success=1.0, prefix="late") if late else [])
    )


class AppStarts(FakeDesktop):
    """A fake desktop whose reset takes as long as its task's app starts: 1.2 s for a task
    whose ``related_apps`` name LibreOffice Calc (a cold start), 0.1 s for the others."""

    async def reset(self, task, *, seed=0):
        heavy = "libreoffice_calc" in task.config.get("related_apps", [])
        await asyncio.sleep(1.2 if heavy else 0.1)
        return await super().reset(task, seed=seed)


@pytest.mark.slow
def test_a_spare_starts_a_heavy_app_early_and_light_attempts_keep_their_order(
    policy_server, tmp_path, monkeypatch
):
    """24 light tasks, then two Calc tasks (the local suite's shape), 2 runners + 2 spares:
    the spares prepare both Calc attempts at once, first, so neither waits for its 1.2 s app
    start on the critical path nor ends the batch; the light attempts start in queue order.
    Without spares the queue order holds and each Calc start is waited for."""
    policy_server.latency = Latency(0.2)  # slack for a loaded machine: a Calc start fits twice
    monkeypatch.setattr(handout, "HEAVY_STARTS", 2)  # as on 2 CPUs, whatever this host has
    entries = light_and_calc(24, 2)
    runs = {}
    for spares in (2, 0):
        config = DesktopConfig(backend="fake")
        pool = [AppStarts(config, i) for i in range(2 + spares)]
        out = tmp_path / f"spares-{spares}"
        summary = collect(
            load_tasks(entries),
            policy(policy_server),
            out,
            desktop_pool=pool,
            spares=spares,
            group=1,
            max_steps=2,
        )
        records = read_records(out)
        assert_accounted(records, summary)
        runs[spares] = sorted(records, key=lambda r: r["started_at"])
    on, off = runs[2], runs[0]
    calc_on = [r for r in on if r["task_id"].startswith("calc")]
    assert all(
        r["timing"]["reset_critical_s"] < 0.2 and r["timing"]["reset_ahead"] for r in calc_on
    )
    assert max(r["ended_at"] for r in calc_on) < max(r["ended_at"] for r in on) - 0.2
    # the two Calc preparations overlapped: each spare started one at the batch's start
    first, second = sorted(calc_on, key=lambda r: r["started_at"])
    assert second["started_at"] < first["started_at"] + 0.5 * first["timing"]["reset_s"]
    light = [r["task_id"] for r in on if not r["task_id"].startswith("calc")]
    assert light == sorted(light)
    assert [r["task_id"] for r in off] == [e["task_id"] for e in entries]  # queue order
    calc_off = [r for r in off if r["task_id"].startswith("calc")]
    assert all(r["timing"]["reset_critical_s"] >= 1.1 for r in calc_off)


def heavy_batch(policy_server, tmp_path, monkeypatch, entries, pool, spares):
    """``entries`` on ``pool`` (2 runners + ``spares``), 2 heavy starts at once at most
    (``HEAVY_STARTS``, as on 2 CPUs, whatever this host has), model calls of 0.2 s: every
    attempt ran once and ended ok; ``(all records, the Calc records by preparation start)``."""
    policy_server.latency = Latency(0.2)
    monkeypatch.setattr(handout, "HEAVY_STARTS", 2)
    out = tmp_path / "out"
    summary = collect(
        load_tasks(entries),
        policy(policy_server),
        out,
        desktop_pool=pool,
        spares=spares,
        group=1,
        max_steps=2,
    )
    records = read_records(out)
    assert_accounted(records, summary)
    assert sorted(r["task_id"] for r in records) == sorted(e["task_id"] for e in entries)
    assert all(r["status"] == "ok" for r in records)
    calc = sorted(
        (r for r in records if r["task_id"].startswith("calc")), key=lambda r: r["started_at"]
    )
    return records, calc


def twelve_light_then_three_calc(policy_server, tmp_path, monkeypatch, spares: int):
    """12 light tasks, then three Calc tasks, on 2 runners + ``spares`` :class:`AppStarts`
    desktops (:func:`heavy_batch`): ``(all records, the Calc records by preparation start,
    the batch's start)``."""
    config = DesktopConfig(backend="fake")
    pool = [AppStarts(config, i) for i in range(2 + spares)]
    records, calc = heavy_batch(
        policy_server, tmp_path, monkeypatch, light_and_calc(12, 3), pool, spares
    )
    return records, calc, min(r["started_at"] for r in records)


def test_a_runner_is_not_left_waiting_while_the_spares_start_heavy_apps(
    policy_server, tmp_path, monkeypatch
):
    """12 light tasks, then three Calc tasks, 2 runners + 2 spares: both spares start a Calc
    app at once; a runner whose attempt ends while they start gets its own desktop prepared
    for the next light attempt (0.1 s), not for the third Calc (1.2 s): a heavy start still
    under way serves no runner soon, so it does not count as their desktop prepared ahead."""
    records, calc, _ = twelve_light_then_three_calc(policy_server, tmp_path, monkeypatch, 2)
    assert calc[1]["started_at"] < calc[0]["started_at"] + 0.6  # both spares at once
    # the third Calc waited for a spare: its start began only once one of the first two had
    # ended (before: on the first runner's freed desktop at ~0.5 s, the runner left waiting)
    first_up = min(c["started_at"] + c["timing"]["reset_s"] for c in calc[:2])
    assert calc[2]["started_at"] >= first_up - 0.05
    light = [r for r in records if not r["task_id"].startswith("calc")]
    assert max(r["timing"]["reset_critical_s"] for r in light) < 0.8  # a light reset, not a Calc


def test_heavy_starts_are_capped_and_the_spare_beyond_the_cap_prepares_a_light_attempt(
    policy_server, tmp_path, monkeypatch
):
    """2 runners + 3 spares, three Calc tasks queued last, at most 2 heavy starts at once
    (``HEAVY_STARTS``, one per CPU): two spares start Calc at the batch's start, the third
    spare prepares the next light attempt ahead, and the third Calc starts only once one of
    the first two has ended."""
    records, calc, t0 = twelve_light_then_three_calc(policy_server, tmp_path, monkeypatch, 3)
    assert calc[1]["started_at"] < t0 + 0.3  # two heavy starts at the batch's start
    first_up = min(c["started_at"] + c["timing"]["reset_s"] for c in calc[:2])
    assert calc[2]["started_at"] >= first_up - 0.05  # not a third at once
    # the spare beyond the cap: a light attempt prepared ahead at the start (5 preparations
    # at t0: the runners' two, the two Calc starts and one more light one)
    assert sum(r["started_at"] < t0 + 0.05 for r in records) == 5


def test_heavy_starts_go_side_by_side_only_while_heavy_executions_are_a_minority(monkeypatch):
    """Up to ``HEAVY_STARTS`` heavy preparations at once when heavy executions are fewer than
    half of the batch (the local suite: 3 Calc tasks of 15), one at a time otherwise
    (OSWorld's offline tasks: 12 heavy attempts of 18), so that the spares keep preparing
    the light minority ahead (BENCHMARKS.md, issue 18 part 6)."""
    from legato_pipelines.rollout.scheduler import Scheduler

    monkeypatch.setattr(handout, "HEAVY_STARTS", 2)

    def starts(light: int, heavy: int, group: int = 1) -> int:
        entries = light_and_calc(light, heavy)
        sched = Scheduler()
        engine._plan(sched, load_tasks(entries), [], group=group, per_group=group, seed=0)
        return handout.Handout(sched, [], lambda ex: None, runners=2).heavy_starts()

    assert starts(12, 3) == 2
    assert starts(3, 6, group=2) == 1
    assert starts(5, 5) == 1  # half: one at a time
    assert starts(6, 5) == 2


class LongCalc(FakeDesktop):
    """A fake desktop shaped like the local suite's on a loaded machine: a Calc task's reset
    takes 1.2 s (the cold start) and each of its actions 0.6 s (long attempts); a light
    task's reset 0.5 s, longer than the rest of a Calc start begun earlier."""

    resets = 0

    async def reset(self, task, *, seed=0):
        self.heavy = "libreoffice_calc" in task.config.get("related_apps", [])
        LongCalc.resets += 1
        await asyncio.sleep(1.2 if self.heavy else 0.5)
        return await super().reset(task, seed=seed)

    async def act(self, action):
        if self.heavy:
            await asyncio.sleep(0.6)
        return await super().act(action)


def light_then_calc(policy_server, tmp_path, monkeypatch, light: int, calc: int):
    """``light`` light tasks, ``calc`` long Calc tasks, ``light`` light ones again, on 2 runners
    + 2 :class:`LongCalc` spares (:func:`heavy_batch`; whatever preparation was given up on
    the way): ``(records, the Calc records by start, resets done)``."""
    monkeypatch.setattr(LongCalc, "resets", 0)
    config = DesktopConfig(backend="fake")
    pool = [LongCalc(config, i) for i in range(4)]
    entries = light_and_calc(light, calc, late=light)
    records, calc_records = heavy_batch(policy_server, tmp_path, monkeypatch, entries, pool, 2)
    return records, calc_records, LongCalc.resets


@pytest.mark.slow
def test_an_idle_light_preparation_is_given_up_for_a_heavy_start_nothing_prepares(
    policy_server, tmp_path, monkeypatch
):
    """The local suite's slow case (BENCHMARKS.md, issue 18 part 8): light attempts, then
    three long Calc attempts, 2 runners + 2 spares, 2 heavy starts at once. The runners take
    the spares' two Calc desktops, leaving their own desktops prepared for light attempts they
    will not run for seconds; the third Calc's start then begins on one of those at once (its
    light attempt goes back to the queue's front) instead of waiting for a Calc attempt to end
    and then ending the batch alone."""
    records, calc, resets = light_then_calc(policy_server, tmp_path, monkeypatch, 6, 3)
    # its start began while the first two Calc attempts ran, not once one had ended
    assert calc[2]["started_at"] < min(c["ended_at"] for c in calc[:2]) - 0.3
    assert resets > len(records)  # a light preparation was given up (and made again later)


async def test_the_give_up_rule_holds_only_while_heavy_executions_are_a_minority(monkeypatch):
    """:meth:`Handout._idle_for_heavy` on its own: one ended light preparation no runner needs
    (both runners busy) and a heavy execution queued with no desktop. It is given up when
    heavy executions are a minority of the batch (the local suite: 3 of 15), never while a
    runner waits (it may be the first preparation to end), never when they are most of it (OSWorld's offline tasks: there the light preparations are the scarce ones;
    on a real batch giving them up put the ``os`` resets on the critical path)."""
    from legato_pipelines.rollout.attempt import Prepared
    from legato_pipelines.rollout.scheduler import Scheduler

    monkeypatch.setattr(handout, "HEAVY_STARTS", 2)

    async def given_up(light: int, heavy: int, waiting: bool = False) -> bool:
        entries = light_and_calc(light, heavy)
        sched = Scheduler()
        engine._plan(sched, load_tasks(entries), [], group=1, per_group=1, seed=0)
        h = handout.Handout(sched, [], lambda ex: None, runners=2)
        h.heavy_starts()  # the regime, fixed from the whole queue
        ex = sched.next()  # a light one, prepared and ended
        done = asyncio.get_running_loop().create_future()
        done.set_result(Prepared(started_at=0.0, t0=0.0, reset=object()))
        handed = handout.Handed(ex, FakeDesktop(DesktopConfig(backend="fake")), 0.0, done)
        h.prepared.append(handed)
        h.busy = 2  # both runners have a desktop: none needs this one
        if waiting:  # ... unless a runner waits (for any preparation to end first)
            h.busy = 1
            h.waiting.append(object())
            h.prepared.append(
                handout.Handed(
                    ex,
                    FakeDesktop(DesktopConfig(backend="fake")),
                    0.0,
                    asyncio.get_running_loop().create_future(),
                )
            )
        return h._idle_for_heavy()

    assert await given_up(12, 3)
    assert not await given_up(3, 6)
    assert not await given_up(12, 3, waiting=True)


async def test_closing_the_hand_out_starts_no_preparation_on_a_free_desktop():
    """``aclose`` cancels the preparations under way and puts their executions back; the
    cancellations must not make a free desktop start preparing one of them (nobody would
    cancel or await it: a reset on a desktop being closed, an execution taken off the queue
    and never recorded)."""
    from legato_pipelines.rollout.scheduler import Scheduler

    sched = Scheduler()
    engine._plan(sched, load_tasks(fake_tasks(2)), [], group=1, per_group=1, seed=0)
    pool, _ = watched_pool(3, latency={"reset": 3.0})
    h = handout.Handout(sched, pool, lambda ex: None, runners=2)
    h._fill()  # two executions, three desktops: one stays free
    assert len(h.prepared) == 2 and len(h.free) == 1
    await asyncio.sleep(0.1)
    await h.aclose()
    await asyncio.sleep(0.1)  # the cancelled preparations' callbacks have run
    running = [t for t in asyncio.all_tasks() if t.get_name().startswith("prepare-")]
    assert running == [] and not h.prepared
    assert sched.pending() == 2  # both back in the queue, not taken
