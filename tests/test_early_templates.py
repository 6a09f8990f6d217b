"""The local desktops' templates started on ``legato``'s first line (``desktops/early.py``,
issue 18): which command lines start which templates, the warm-up taking them over (real
template processes, the real OSWorld venv), one started for another environment refused and
stopped, and none left running when nobody takes them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from legato_pipelines.desktops import early, processes
from legato_pipelines.desktops.osworld_worker.template import WorkerTemplate, preloading_command
from legato_pipelines.desktops.server.procs import process_table
from legato_pipelines.desktops.server.template import ServerTemplate, template_command
from tests.osworld_backend_support import osworld_python

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    processes.stop_early()


def planned(argv: list[str]) -> list[list[str]]:
    """The command lines :func:`early.start` would start for ``argv``."""
    return [cmd for cmd, _env, _own_dir in early._templates_for(argv)]


def test_which_command_lines_start_which_templates(monkeypatch, tmp_path):
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.touch()
    monkeypatch.setenv("LEGATO_OSWORLD_VENV", str(tmp_path / "venv"))
    server, _ = template_command()
    grader, _ = preloading_command(str(venv_python))
    base = ["collect", "--tasks", "t.json", "--policy-url", "http://x", "--model", "m"]

    assert planned([*base, "--backend", "local"]) == [server, grader]
    assert planned([*base, "--backend=LOCAL"]) == [server, grader]  # any case, as the CLI
    assert planned([*base, "--backend", "local", "--desktop-option", "grader=own"]) == [server]
    attached = ["--desktop-option", 'urls=["http://127.0.0.1:5000"]']
    assert planned([*base, "--backend", "local", *attached]) == [grader]
    other = tmp_path / "other" / "python"
    other.parent.mkdir()
    other.touch()
    assert planned([*base, "--backend", "local", f"--osworld-python={other}"]) == [
        server,
        preloading_command(str(other))[0],
    ]
    for argv in (
        [*base, "--backend", "osworld"],
        [*base, "--backend", "fake"],
        base,  # the CLI's default backend is osworld
        [*base, "--backend", "local", "--help"],
        ["export", "--backend", "local"],
        [],
    ):
        assert planned(argv) == [], argv
    monkeypatch.setenv("LEGATO_OSWORLD_VENV", str(tmp_path / "nothing-here"))
    assert planned([*base, "--backend", "local"]) == [server]  # no venv: the own grader


def test_a_command_line_it_cannot_read_starts_nothing_and_raises_nothing(tmp_path):
    early.start(["collect", "--backend", "local", "--desktop-option", "no-equals-sign"])
    early.start(["collect", "--backend", "local", "--osworld-python", str(tmp_path / "none")])
    early.start(["collect", "--backend"])
    assert processes._early == []


async def test_the_warm_up_takes_over_the_server_template_started_early():
    """:meth:`ServerTemplate.ready` adopts the template :func:`early.start` began (the same
    process: its pid), and it forks servers as one it started itself would."""
    early.start(["collect", "--backend", "local", "--desktop-option", "grader=own"])
    [started] = processes._early
    template = ServerTemplate()
    try:
        assert await template.ready()
        assert processes._early == []  # taken
        assert template.pid == started.popen.pid
        assert template.alive()
    finally:
        await template.close()
    assert started.popen.poll() is not None  # stopped by its new owner, and reaped


@pytest.mark.slow
async def test_the_warm_up_takes_over_the_graders_template_importing_already():
    """:meth:`WorkerTemplate.ready` adopts the worker started with ``--preload``: the same
    process, desktop_env imported before the template was asked to (its ``preload`` answer
    then costs no import)."""
    python = osworld_python()
    argv, env = preloading_command(python)
    processes.spawn_early(argv, env, own_dir=True)
    [started] = processes._early
    template = WorkerTemplate(python)
    try:
        worker = await template.ready()
        assert worker is not None and processes._early == []
        assert worker.pid == started.popen.pid
        answer = await worker.call("preload", 60.0)
        assert answer["import_s"] < 0.05  # imported at its start, not now
        assert os.path.isdir(started.cwd)  # its directory is the template's now
    finally:
        await template.close()
    assert not os.path.exists(started.cwd)


def test_a_template_started_for_another_environment_is_refused_and_stopped():
    argv, env = template_command()
    processes.spawn_early(argv, {**env, "LEGATO_SOMETHING_ELSE": "1"})
    [started] = processes._early
    assert processes.take_early(argv, env) is None
    assert processes._early == []
    assert started.popen.poll() is not None


def test_templates_nobody_took_are_stopped_when_legato_exits(tmp_path):
    """A command that ends before its warm-up (a failed policy check, nothing to do) leaves no
    template running: they are killed at exit and the graders' directory removed."""
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {REPO!r})
        from legato_pipelines.desktops import early, processes
        from legato_pipelines.desktops.server.template import template_command
        argv, env = template_command()
        processes.spawn_early(argv, env, own_dir=True)
        print(json.dumps([[s.popen.pid, s.cwd] for s in processes._early]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    [[pid, cwd]] = json.loads(out.stdout)
    assert not os.path.exists(cwd)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped by the exiting process


async def test_a_warm_up_cancelled_while_it_takes_a_template_over_leaves_nothing_running():
    """Cancelled right after it took the early template (its pipes not joined to the loop
    yet): the template is killed and reaped, not orphaned."""
    argv, env = template_command()
    processes.spawn_early(argv, env)
    [started] = processes._early
    template = ServerTemplate()
    starting = asyncio.create_task(template.ready())
    await asyncio.sleep(0)  # it took the process and awaits the pipes
    assert processes._early == []
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await template.close()
    assert started.popen.poll() is not None


async def test_the_warm_up_stops_templates_started_early_that_it_did_not_take(tmp_path):
    """A template started for a command line the warm-up does not use (the command line read
    one way on the first line, the options another) is stopped once the warm-up has taken
    its own, not left running for the whole batch."""
    from legato_pipelines.desktops import warm_up
    from legato_pipelines.desktops.base import DesktopConfig

    argv, env = template_command()
    processes.spawn_early(argv, env)
    processes.spawn_early([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    taken, other = processes._early
    async with warm_up(DesktopConfig(backend="local", options={"grader": "own"})):
        assert processes._early == []
        assert other.popen.poll() is not None  # stopped
        assert taken.popen.poll() is None  # the server template, now the warm-up's


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_the_cli_imports_stops_the_templates(tmp_path, signum):
    """``legato collect --backend local`` stopped by SIGTERM, SIGHUP or Ctrl-C while it
    imports its CLI (its templates already started): it exits 128+signal without a
    traceback and leaves neither template running nor the graders' directory.

    The signal lands inside the CLI's imports by construction, not by timing: a stand-in
    ``typer`` on the path takes a minute to import. It sleeps in code run by ``exec`` of a
    string, as dataclasses and typer's annotations are while the real CLI starts: CPython
    3.11 then marks a Ctrl-C unhandled even once caught, and the process used to end killed
    by SIGINT (-2) instead of exiting 130 (CI, stop 37)."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    slow = tmp_path / "slow_imports" / "typer"
    slow.mkdir(parents=True)
    (slow / "__init__.py").write_text('exec("import time\\ntime.sleep(60)")\n')
    pythonpath = os.pathsep.join([str(slow.parent), REPO])
    env = {**os.environ, "PYTHONPATH": pythonpath, "TMPDIR": str(private_tmp)}
    osworld_python()  # the graders' template needs the venv
    cmd = [sys.executable, "-m", "legato_pipelines", "collect", "--backend", "local"]
    cmd += ["--tasks", "t.json", "--policy-url", "http://127.0.0.1:9", "--model", "m"]
    cmd += ["--out", str(tmp_path / "run")]
    stderr = tmp_path / "stderr"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stderr=err)
    templates: list[int] = []
    deadline = time.monotonic() + 20.0
    while len(templates) < 2 and time.monotonic() < deadline:
        templates = children_running(proc.pid, (b"desktops.server.template", b"--preload"))
        time.sleep(0.005)
    assert len(templates) == 2
    time.sleep(1.0)  # well inside the stand-in's minute-long import
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 128 + signum
    for pid in templates:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert [n for n in os.listdir(private_tmp) if n.startswith("legato-osworld-template")] == []
    said = stderr.read_text()
    assert "Traceback" not in said
    if signum == signal.SIGINT:
        assert "interrupted before the command started" in said
    else:
        assert f"stopped by {signal.Signals(signum).name}" in said


def children_running(parent: int, markers: tuple[bytes, ...]) -> list[int]:
    """Children of ``parent`` whose command line holds one of ``markers``."""
    found = []
    for info in process_table().values():
        if info.ppid != parent:
            continue
        try:
            with open(f"/proc/{info.pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if any(m in cmdline for m in markers):
            found.append(info.pid)
    return found
