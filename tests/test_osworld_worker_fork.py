"""Osworld workers forked from a preloaded template (issue 18): op ``fork`` of the real worker
under the OSWorld venv, ``WorkerProcess(template=...)`` on a Unix socket, the fallback to a
spawn when the template is gone, and the shared template of the local graders."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time

import pytest

from legato_pipelines.desktops.child_env import SINGLE_THREADED
from legato_pipelines.desktops.osworld_worker import channel, template
from legato_pipelines.desktops.osworld_worker.desktop_grader import OSWorldGrader
from legato_pipelines.desktops.osworld_worker.options import worker_env
from legato_pipelines.errors import DesktopError

from .osworld_backend_support import osworld_python

PLAN = {"provider": "local", "vm_url": "http://127.0.0.1:1", "cache_dir": "/tmp/legato-cache"}


@pytest.fixture(scope="module")
def python() -> str:
    return osworld_python()


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state first); [] when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return []


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` disappears (ended and reaped: no zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc_stat(pid):
            return True
        time.sleep(0.05)
    return False


def worker(python: str, path, name: str, tmpl=None) -> channel.WorkerProcess:
    return channel.WorkerProcess(
        python,
        # one BLAS thread, as the graders' template: only a single-threaded worker forks
        env=worker_env({"LEGATO_TEST_NAME": name, **SINGLE_THREADED}, provider="local"),
        cwd=str(path / name),
        name=name,
        log_path=str(path / f"{name}.log"),
        template=tmpl,
    )


async def preloaded(python: str, path) -> channel.WorkerProcess:
    tmpl = worker(python, path, "template")
    await tmpl.start()
    assert (await tmpl.call("preload", 120))["import_s"] > 0.2
    return tmpl


async def test_a_forked_worker_answers_as_a_spawned_one(python, tmp_path):
    tmpl = await preloaded(python, tmp_path)
    spawned, forked = worker(python, tmp_path, "spawned"), worker(python, tmp_path, "a", tmpl)
    try:
        await spawned.start()
        await forked.start()
        assert forked.forked and not spawned.forked and forked.alive()
        assert forked.pid not in (tmpl.pid, None)
        assert int(proc_stat(forked.pid)[1]) == tmpl.pid  # the template's child, not ours
        assert os.getsid(forked.pid) == forked.pid  # its own session
        assert await forked.call("plan", 10, **PLAN) == await spawned.call("plan", 30, **PLAN)
        # desktop_env came imported with the fork, its objects frozen (gc.freeze: a child's
        # collections neither scan nor copy them)
        preload = await forked.call("preload", 10)
        assert preload["import_s"] < 0.05 and preload["gc_frozen"] > 10_000
        assert (await spawned.call("preload", 60))["gc_frozen"] == 0
        with pytest.raises(DesktopError, match="unknown op 'nope'"):
            await forked.call("nope", 10)
        assert forked.alive()
    finally:
        await asyncio.gather(spawned.stop(5), forked.stop(5), tmpl.stop(5))


async def test_a_template_running_threads_refuses_to_fork_and_the_worker_is_spawned(
    python, tmp_path
):
    """A forked child gets only the forking thread, with whatever locks the others held: a
    template with more than one thread (OpenBLAS's pool without ``OPENBLAS_NUM_THREADS=1``)
    refuses op ``fork``, and the worker is spawned instead (with a warning)."""
    tmpl = channel.WorkerProcess(
        python,
        env=worker_env({"OPENBLAS_NUM_THREADS": "2"}, provider="local"),
        cwd=str(tmp_path / "threaded"),
        name="threaded",
        log_path=str(tmp_path / "threaded.log"),
    )
    await tmpl.start()
    await tmpl.call("preload", 120)
    with open(f"/proc/{tmpl.pid}/status") as status:
        assert "Threads:\t1\n" not in status.read()  # numpy's BLAS pool
    a = worker(python, tmp_path, "a", tmpl)
    try:
        with pytest.raises(DesktopError, match="threads; only one may fork"):
            await tmpl.call(
                "fork", 10, socket="/nonexistent", env={"A": "1"}, cwd="/", log_path="/dev/null"
            )
        await a.start()
        assert not a.forked and a.alive()  # spawned instead
    finally:
        await asyncio.gather(a.stop(5), tmpl.stop(5))


async def test_two_forks_are_separate_processes_in_their_own_directories(python, tmp_path):
    tmpl = await preloaded(python, tmp_path)
    a, b = worker(python, tmp_path, "a", tmpl), worker(python, tmp_path, "b", tmpl)
    try:
        await asyncio.gather(a.start(), b.start())
        assert a.forked and b.forked and a.pid != b.pid
        for w in (a, b):
            assert os.readlink(f"/proc/{w.pid}/cwd") == os.path.realpath(w.cwd)
        await a.stop(5)
        assert not a.alive()
        assert (await b.call("plan", 10, **PLAN))["kwargs"]["path_to_vm"] == PLAN["vm_url"]
        # a fork request without its fields is refused, naming them
        with pytest.raises(DesktopError, match="fork needs socket"):
            await tmpl.call("fork", 10)
    finally:
        await asyncio.gather(a.stop(5), b.stop(5), tmpl.stop(5))


async def test_stopped_or_killed_forks_end_and_are_reaped_by_the_template(python, tmp_path):
    tmpl = await preloaded(python, tmp_path)
    a, b = worker(python, tmp_path, "a", tmpl), worker(python, tmp_path, "b", tmpl)
    try:
        await a.start()
        await b.start()
        pid_a, pid_b = a.pid, b.pid
        await a.stop(5)
        assert not a.alive() and a.pid is None
        assert wait_gone(pid_a)  # reaped: no zombie left under the template
        os.kill(pid_b, signal.SIGKILL)
        assert wait_gone(pid_b)
        assert not b.alive()
        with pytest.raises(DesktopError, match="not running") as failed:
            await b.call("plan", 10, **PLAN)
        assert failed.value.kind == "transport"
        # SIGCHLD is caught (a handler that waits), not ignored: the children's CPU counts
        with open(f"/proc/{tmpl.pid}/status") as f:
            caught = next(int(row.split()[1], 16) for row in f if row.startswith("SigCgt:"))
        assert caught & (1 << (signal.SIGCHLD - 1))
    finally:
        await asyncio.gather(a.stop(5), b.stop(5), tmpl.stop(5))


async def test_a_fork_that_exits_during_a_call_names_no_exit_code(python, tmp_path):
    tmpl = await preloaded(python, tmp_path)
    a = worker(python, tmp_path, "a", tmpl)
    try:
        await a.start()
        os.kill(a.pid, signal.SIGSTOP)  # it will get the request but never answer ...
        call = asyncio.create_task(a.call("plan", 30, **PLAN))
        await asyncio.sleep(0.3)
        os.kill(a.pid, signal.SIGKILL)  # ... it dies
        with pytest.raises(DesktopError) as failed:
            await call
        # EOF or a reset (the request was still unread in its socket), never a made-up code
        assert re.search(r"worker (exited|channel broke) during plan", str(failed.value))
        assert not re.search(r"exited \(", str(failed.value))
        assert failed.value.kind == "transport"
        assert not a.alive()
    finally:
        await asyncio.gather(a.stop(5), tmpl.stop(5))


async def test_forks_outlive_a_killed_template_and_later_workers_are_spawned(
    python, tmp_path, caplog
):
    tmpl = await preloaded(python, tmp_path)
    a, b = worker(python, tmp_path, "a", tmpl), worker(python, tmp_path, "b", tmpl)
    try:
        await a.start()
        os.kill(tmpl.pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        assert not tmpl.alive()  # its protocol pipe hit EOF: the fork did not keep it open
        assert a.alive()
        assert (await a.call("plan", 10, **PLAN))["kwargs"]["path_to_vm"] == PLAN["vm_url"]
        with caplog.at_level(logging.WARNING, logger=channel.__name__):
            await b.start()
        assert not b.forked and "spawning one" in caplog.text
        assert (await b.call("plan", 30, **PLAN))["kwargs"]["path_to_vm"] == PLAN["vm_url"]
    finally:
        await asyncio.gather(a.stop(5), b.stop(5), tmpl.stop(5))


async def test_the_template_is_shared_by_lease_and_stopped_by_the_last(python, tmp_path):
    first, second = template.acquire_template(python), template.acquire_template(python)
    assert first is second and first.users == 2
    ready = await asyncio.gather(first.ready(), second.ready())
    assert ready[0] is ready[1] and ready[0].alive()
    pid = ready[0].pid
    with open(f"/proc/{pid}/status") as status:  # desktop_env imported: still one thread
        assert "Threads:\t1\n" in status.read()  # (forks copy only the forking thread)
    a = worker(python, tmp_path, "a", ready[0])
    try:
        await a.start()
        assert a.forked
        await template.release_template(first)
        assert ready[0].alive()
        await template.release_template(second)
        assert not ready[0].alive() and wait_gone(pid)
        assert a.alive()  # a fork lives on
        later = template.acquire_template(python)
        assert later is not first and later.worker is None  # a new one, started when needed
        await template.release_template(later)
    finally:
        await a.stop(5)
        await first.close()


async def test_stopping_a_fork_during_a_call_ends_when_it_ended_not_after_the_grace(
    python, tmp_path
):
    """Two waits on one forked worker (the call that saw its channel close, the stop that
    ended it) both end when the process does: a second waiter must not take the first's
    place on the pidfd (the stop would then sleep out its whole grace, or the call hang)."""
    tmpl = await preloaded(python, tmp_path)
    a = worker(python, tmp_path, "a", tmpl)
    try:
        await a.start()
        assert a.forked
        pid = a.pid
        os.kill(pid, signal.SIGSTOP)  # the call below gets no answer
        calling = asyncio.create_task(a.call("plan", 60, **PLAN))
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        await asyncio.wait_for(a.stop(grace=20), 30)
        assert time.monotonic() - t0 < 5.0, "stop() slept out its grace"
        with pytest.raises(DesktopError, match="exited during plan"):
            await asyncio.wait_for(calling, 10)
        assert wait_gone(pid)
    finally:
        await asyncio.gather(a.stop(5), tmpl.stop(5))


def forked_grader(python: str, name: str) -> OSWorldGrader:
    """A local desktop's grader (not started) whose worker is forked from the shared template,
    pointed at no desktop."""
    return OSWorldGrader(
        name=name,
        python=python,
        url="http://127.0.0.1:1",
        token="t",
        screen_size=(1024, 768),
        template=True,
    )


async def test_a_grader_close_cancelled_midway_still_stops_its_worker_and_ends_its_lease(python):
    """A batch cancelled while its desktops close: the grader's close, cancelled while its
    worker answers ``close``, still stops the worker and ends its lease (the last lease
    stops the template); else the template outlives every desktop."""
    grader = forked_grader(python, "cancelled")
    probe = template.acquire_template(python)  # the grader's template, watched from here
    try:
        await grader.spawn()
        assert grader.worker.forked and probe.users == 2
        pid = grader.worker.pid
        os.kill(pid, signal.SIGSTOP)  # its answer to ``close`` does not come
        closing = asyncio.create_task(grader.close())
        await asyncio.sleep(0.3)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert probe.users == 1, "the cancelled close kept its lease on the template"
        assert wait_gone(pid)
    finally:
        await template.release_template(probe)
        await grader.close()


async def test_the_template_imports_the_tasks_metrics_before_its_first_fork(python):
    """The batch's tasks name their metrics and getters; each worker imported their modules
    (pandas, openpyxl...) at its first setup, on the first attempts' critical path. The
    template imports them once (op ``warm``), before its first fork: every worker comes
    with them."""
    table = {"func": "compare_table", "result": {"type": "vm_file"}}
    evaluators = [table, dict(table), {"func": "no_such_metric"}]
    grader = forked_grader(python, "warm")
    try:
        async with template.template_started(python, evaluators) as shared:
            assert shared.evaluators == [table, {"func": "no_such_metric"}]  # duplicates dropped
            await grader.spawn()
            warmed = shared.warmed
            assert warmed is not None and warmed["names"] == 3 and warmed["failed"] == 1
            assert warmed["new_modules"] > 50  # pandas, openpyxl, the metric modules
            assert "desktop_env.evaluators.metrics.table" in warmed["modules"]
            assert "desktop_env.evaluators.getters.file" in warmed["modules"]
            # the forked worker came with them: nothing left to import
            again = await grader.worker.call("warm", 30, evaluators=evaluators)
            assert again["new_modules"] == 0 and again["modules"] == warmed["modules"]
            with pytest.raises(DesktopError, match="evaluators must be a list"):
                await grader.worker.call("warm", 10, evaluators="compare_table")
            with open(f"/proc/{shared.worker.pid}/status") as status:
                assert "Threads:\t1\n" in status.read()  # still safe to fork
    finally:
        await grader.close()


def pidfd_targets(pid: int) -> set[int]:
    """The processes ``pid`` holds a pidfd of (``Pid:`` in /proc/<pid>/fdinfo of a pidfd)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("Pid:"):
                        found.add(int(line.split()[1]))
        except OSError:
            pass
    return found


async def test_spawned_and_forked_workers_watch_the_collector_they_serve(python, tmp_path):
    """From op ``start`` on, each worker waits on its collector's pidfd (``end_with_client``):
    a spawned one on its parent's, a forked one on its socket peer's (SO_PEERCRED), not on
    the template's; the template itself never starts a DesktopEnv and watches nothing."""
    tmpl = await preloaded(python, tmp_path)
    a = worker(python, tmp_path, "a", tmpl)
    b = worker(python, tmp_path, "b")
    try:
        await asyncio.gather(a.start(), b.start())
        assert a.forked and not b.forked
        for w in (a, b):
            pid = w.pid
            assert os.getpid() not in pidfd_targets(pid)
            # no VM server at port 1: DesktopEnv waits for it, the watch has begun
            starting = asyncio.create_task(w.call("start", 120, **PLAN))
            deadline = time.monotonic() + 20
            while os.getpid() not in pidfd_targets(pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert os.getpid() in pidfd_targets(pid)
            assert tmpl.pid not in pidfd_targets(pid)
            starting.cancel()  # the channel stops the worker
            with pytest.raises(asyncio.CancelledError):
                await starting
        assert pidfd_targets(tmpl.pid) == set()
    finally:
        await asyncio.gather(a.stop(5), b.stop(5), tmpl.stop(5))


@pytest.mark.slow
def test_a_worker_whose_collector_was_killed_ends_though_its_pipe_stays_open(python):
    """A collector killed with SIGKILL: its worker ends at once, without waiting for its
    protocol to break (here another process still holds its stdin open, as DesktopEnv's retry
    loops would keep it from reading for ~100 s)."""
    import subprocess
    import sys

    read, write = os.pipe()  # this test keeps the write end: the worker's stdin never ends
    request = {"id": 1, "op": "start", **PLAN}
    os.write(write, json.dumps(request).encode() + b"\n")  # it fails, after the watch began
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"w = subprocess.Popen([{python!r}, '-I', {str(channel.WORKER_SCRIPT)!r}],"
            f" stdin={read}, stdout=subprocess.DEVNULL)\n"
            "print(w.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        pass_fds=(read,),
        text=True,
    )
    try:
        pid = int(client.stdout.readline())
        deadline = time.monotonic() + 10
        while client.pid not in pidfd_targets(pid) and time.monotonic() < deadline:
            time.sleep(0.02)  # until its watch runs
        client.kill()
        client.wait()
        assert wait_gone(pid, 10)
    finally:
        os.close(read)
        os.close(write)
        if client.poll() is None:
            client.kill()


def test_a_collector_gone_while_a_vm_is_made_ends_the_worker_once_the_vm_is_there(python):
    """While a VM provider's DesktopEnv is being made (docker: the container runs, DesktopEnv
    waits for its server), the collector's end is only noted: exiting then would leave the
    VM running. Once the construction ended, the worker SIGTERMs itself (its handler closes
    DesktopEnv and exits). With the local provider (nothing of ours to leak) it ends at once."""
    import subprocess

    probe = f"""
import runpy, signal
w = runpy.run_path({str(channel.WORKER_SCRIPT)!r})
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append("TERM"))
worker = w["Worker"]()
worker._making_vm = True
worker.client_gone()
signal.pthread_sigmask(signal.SIG_BLOCK, [])  # let a pending signal run its handler
print("during", got, worker._orphaned)
worker._vm_made()
print("after", got)
worker.client_gone()
print("local", got)
"""
    done = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "during [] True",
        "after ['TERM']",
        "local ['TERM', 'TERM']",
    ]
