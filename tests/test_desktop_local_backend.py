"""The ``local`` backend (LocalDesktop) end to end: real servers, real Xvfb, real apps."""

from __future__ import annotations

import math
import os

import pytest

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import Desktop, DesktopConfig
from legato_pipelines.desktops.server import LocalDesktop, open_local_desktops
from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV
from legato_pipelines.errors import ConfigError, DesktopError
from legato_pipelines.tasks import Task
from tests.desktop_local_support import RunningServer, needs_apps, needs_xvfb, proc_state

pytestmark = [needs_xvfb, pytest.mark.desktop]

CONFIG = DesktopConfig(backend="local", screen_width=800, screen_height=600)


def editor_task(expected: str) -> Task:
    """Open ~/todo.txt in l3afpad; graded by the file's content."""
    return Task(
        task_id="edit-todo",
        domain=None,
        source="inline",
        config={
            "instruction": "Write the word into todo.txt and save it.",
            "config": [
                {
                    "type": "execute",
                    "parameters": {"command": "printf '' > ~/todo.txt", "shell": True},
                },
                {"type": "launch", "parameters": {"command": ["l3afpad", "~/todo.txt"]}},
            ],
            "evaluator": {
                "func": "exact_match",
                "result": {"type": "vm_command_line", "command": "cat ~/todo.txt", "shell": True},
                "expected": {"type": "rule", "rules": {"expected": expected}},
            },
        },
    )


@pytest.fixture
async def desktop():
    (d,) = await open_local_desktops(CONFIG, 1)
    yield d
    await d.close()


@needs_apps
async def test_an_attempt_end_to_end(desktop: LocalDesktop):
    assert isinstance(desktop, Desktop) and desktop.screen_size == (800, 600)
    task = editor_task("done")
    assert await desktop.reset(task) == "fast"
    after_reset = await desktop.wait_after_reset()
    assert after_reset.ready_s is not None and math.isfinite(after_reset.ready_s)
    assert (await desktop.observe()).size == (800, 600)
    for action in (Action("type", text="done"), Action("key", keys=("ctrl", "s"))):
        await desktop.act(action)
        waited = await desktop.wait_after_action(action)
        assert waited.ready_s is not None and 0 < waited.ready_s <= waited.wait_s < 5.0
    await desktop.wait_before_eval()
    assert (await desktop.evaluate(task)).reward == 1.0
    # The next attempt starts from a clean HOME: nothing typed yet, so the grade is 0.
    assert await desktop.reset(task) == "fast"
    await desktop.wait_after_reset()
    assert (await desktop.evaluate(task)).reward == 0.0


async def test_recover_restarts_a_killed_server(desktop: LocalDesktop):
    old_pid = desktop.server.pid
    desktop.server.kill()
    with pytest.raises(DesktopError) as failure:
        await desktop.observe()
    assert failure.value.kind in ("transport", "timeout")
    await desktop.recover()
    assert desktop.server.pid != old_pid and proc_state(old_pid) in (None, "Z")
    assert (await desktop.observe()).size == (800, 600)
    assert await desktop.reset(Task("t", None, {"instruction": "nothing"}, "inline")) == "fast"


async def test_fast_reset_off_means_a_full_restart_and_fixed_wait_is_the_baseline():
    config = DesktopConfig(
        backend="local",
        screen_width=640,
        screen_height=480,
        fast_reset=False,
        ready_signal=False,
        fixed_wait=0.2,
    )
    (d,) = await open_local_desktops(config, 1)
    try:
        assert await d.reset(Task("t", None, {"instruction": "nothing"}, "inline")) == "revert"
        waited = await d.wait_after_action(Action("left_click", x=5, y=5))
        assert waited.ready_s is None and waited.wait_s >= 0.2
    finally:
        await d.close()


async def test_desktops_start_concurrently_and_close_cleanly():
    desktops = await open_local_desktops(CONFIG, 2)
    pids = [d.server.pid for d in desktops]
    try:
        displays = {(await d.client.health())["display"] for d in desktops}
        assert len(displays) == 2
    finally:
        for d in desktops:
            await d.close()
    assert all(proc_state(pid) in (None, "Z") for pid in pids)


async def test_attach_to_a_running_server_by_url(monkeypatch):
    server = RunningServer(width=640, height=480)
    try:
        monkeypatch.setenv(DEFAULT_TOKEN_ENV, server.token)
        (d,) = await open_local_desktops(
            DesktopConfig(backend="local", options={"urls": [server.url]}), 1
        )
        assert d.server is None and d.screen_size == (640, 480)
        generation = (await d.client.health())["generation"]
        await d.recover()  # attached: a full restart of its display, then a health check
        assert (await d.client.health())["generation"] == generation + 1
        await d.close()
        assert server.proc.poll() is None  # attached servers belong to whoever started them
    finally:
        server.stop()


async def test_bad_options_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match="not local-backend options"):
        await open_local_desktops(DesktopConfig(backend="local", options={"bogus": 1}), 1)
    with pytest.raises(ConfigError, match="lists 1 servers but 2"):
        await open_local_desktops(
            DesktopConfig(backend="local", options={"urls": ["http://127.0.0.1:1"]}), 2
        )
    for options, message in (
        ({"network": "bridge"}, "must be one of auto, host, none, own, got 'bridge'"),
        ({"network": "own", "sandbox": False}, "network=own needs the sandbox"),
    ):
        with pytest.raises(ConfigError, match=message):
            await open_local_desktops(DesktopConfig(backend="local", options=options), 1)
    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match=DEFAULT_TOKEN_ENV):
        await open_local_desktops(
            DesktopConfig(backend="local", options={"urls": ["http://127.0.0.1:1"]}), 1
        )


async def test_the_server_never_sees_the_policy_key(monkeypatch):
    monkeypatch.setenv("LEGATO_POLICY_KEY", "sk-should-not-leak")
    (d,) = await open_local_desktops(CONFIG, 1)
    try:
        with open(f"/proc/{d.server.pid}/environ", "rb") as f:
            environ = f.read()
        assert b"sk-should-not-leak" not in environ
        out = await d.client.execute("env", shell=True)
        assert "sk-should-not-leak" not in out["output"] and d.server.token not in out["output"]
        assert os.environ["LEGATO_POLICY_KEY"] == "sk-should-not-leak"
    finally:
        await d.close()


#: Cloud and hub credentials a collector host may hold (fake values, never real).
CLOUD_CREDENTIALS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-should-not-leak",
    "AWS_SESSION_TOKEN": "aws-session-should-not-leak",
    "AZURE_CLIENT_SECRET": "azure-secret-should-not-leak",
    "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp-should-not-leak.json",
    "HF_TOKEN": "hf-token-should-not-leak",
}


async def test_the_server_its_apps_and_its_grader_never_see_cloud_credentials(monkeypatch):
    """A local desktop needs no cloud: neither its server, the commands run on it (the policy's
    too), nor its grader worker (OSWorld's code, provider local) inherit AWS, Azure, Google or
    hub credentials, whatever this process holds."""
    from legato_pipelines.desktops.osworld_worker import osworld_python

    for name, value in CLOUD_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    (d,) = await open_local_desktops(CONFIG, 1)
    try:
        processes = {"server": d.server.pid}
        if osworld_python({}) is not None:  # the venv is installed: the grader is OSWorld's
            assert d.grader is not None and d.grader.worker is not None
            processes["grader worker"] = d.grader.worker.pid
        for what, pid in processes.items():
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            for name, value in CLOUD_CREDENTIALS.items():
                assert value.encode() not in environ, (what, name)
        out = await d.client.execute("env", shell=True)
        for value in CLOUD_CREDENTIALS.values():
            assert value not in out["output"]
        assert os.environ["AWS_SESSION_TOKEN"] == CLOUD_CREDENTIALS["AWS_SESSION_TOKEN"]
    finally:
        await d.close()
