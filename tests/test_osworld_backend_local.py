"""The osworld backend end to end: real DesktopEnv, SetupController and OSWorld's evaluators
in a worker under the OSWorld venv, against a real local desktop (provider ``local``).

Rewards must equal the ``local`` backend's on the same tasks with the same scripts.
"""

from __future__ import annotations

import shutil

import pytest

from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.client import DesktopClient
from legato_pipelines.errors import DesktopError

from .desktop_sandbox_support import osworld_task
from .osworld_backend_support import (
    needs_desktop_apps,
    needs_vm_python,
    osworld_python,
    run_script,
    suite_scripts,
    suite_tasks,
)

#: Terminal and text-editor tasks (vm_file / vm_command_line getters; check_include_exclude,
#: exact_match, compare_text_file metrics; infeasible).
TASKS = (
    "local-term-mkdir",
    "local-term-count-lines",
    "local-term-sort",
    "local-edit-append",
    "local-term-infeasible",
)

pytestmark = [pytest.mark.desktop, pytest.mark.slow, needs_desktop_apps, needs_vm_python]


def osworld_config(tmp_path, **options) -> DesktopConfig:
    return DesktopConfig(
        backend="osworld",
        options={
            "osworld_python": osworld_python(),
            "provider": "local",
            "cache_dir": str(tmp_path / "cache"),
            "work_dir": str(tmp_path / "work"),
            **options,
        },
    )


async def rewards_of(config: DesktopConfig, tasks, scripts) -> dict[tuple[str, str], float]:
    [desktop] = await open_desktops(config, 1)
    out = {}
    try:
        for task_id in TASKS:
            task = tasks[task_id]
            for name in ("correct", "wrong"):
                _, evaluation = await run_script(desktop, task, scripts[name][task.instruction])
                assert evaluation.error is None, (task_id, name, evaluation.error)
                out[task_id, name] = evaluation.reward
    finally:
        await desktop.close()
    return out


async def test_osworld_rewards_equal_local_rewards(tmp_path):
    tasks, scripts = suite_tasks(), suite_scripts()
    osworld = await rewards_of(osworld_config(tmp_path), tasks, scripts)
    # the local backend's own subset (grader=own) must grade as OSWorld's code does
    local = await rewards_of(
        DesktopConfig(backend="local", options={"grader": "own"}), tasks, scripts
    )
    assert osworld == local
    assert {osworld[t, "correct"] for t in TASKS} == {1.0}
    assert all(osworld[t, "wrong"] < 1.0 for t in TASKS)


async def test_fast_reset_and_revert_both_restore_a_clean_home(tmp_path):
    tasks = suite_tasks()
    task = tasks["local-term-mkdir"]
    correct = suite_scripts()["correct"][task.instruction]
    [desktop] = await open_desktops(osworld_config(tmp_path), 1)
    try:
        kind, first = await run_script(desktop, task, correct)
        assert (kind, first.reward) == ("fast", 1.0)
        # after a fast reset the folder the last attempt made is gone: doing nothing scores 0
        assert await desktop.reset(task) == "fast"
        assert (await desktop.evaluate(task)).reward == 0.0
        kind, again = await run_script(desktop, task, correct)
        assert (kind, again.reward) == ("fast", 1.0)
        desktop.config = desktop.config.model_copy(update={"fast_reset": False})
        assert await desktop.reset(task) == "revert"
        assert desktop.last_reset["revert_s"] > 0
        assert (await desktop.evaluate(task)).reward == 0.0
    finally:
        await desktop.close()


async def test_dead_vm_is_a_desktop_error_and_recover_brings_it_back(tmp_path):
    task = suite_tasks()["local-term-mkdir"]
    [desktop] = await open_desktops(osworld_config(tmp_path, call_timeout=20, reset_timeout=30), 1)
    try:
        await desktop.reset(task)
        desktop.vm_server.kill()  # the "VM" dies
        with pytest.raises(DesktopError) as err:
            await desktop.observe()
        assert err.value.kind == "vm"
        with pytest.raises(DesktopError) as err:
            await desktop.reset(task)
        assert err.value.kind in ("vm", "setup")
        await desktop.recover()
        assert await desktop.reset(task) == "revert"  # first reset after a failure reverts
        shot = await desktop.observe()
        assert (shot.width, shot.height) == desktop.screen_size
        assert (await desktop.evaluate(task)).reward == 0.0
    finally:
        await desktop.close()


async def test_fixed_wait_baseline_and_the_servers_own_ready_endpoint(tmp_path):
    from legato_pipelines.actions import Action

    task = suite_tasks()["local-term-mkdir"]
    action = Action(action="type", text="echo ready\n")
    fixed = osworld_config(tmp_path).model_copy(update={"ready_signal": False, "fixed_wait": 0.3})
    server = osworld_config(tmp_path, ready="server")
    for config in (fixed, server):
        [desktop] = await open_desktops(config, 1)
        try:
            await desktop.reset(task)
            await desktop.wait_after_reset()
            await desktop.act(action)
            wait = await desktop.wait_after_action(action)
            if config is fixed:
                assert wait.ready_s is None and wait.wait_s >= 0.3
            else:
                assert 0 < wait.ready_s <= wait.wait_s < 5
        finally:
            await desktop.close()


async def test_the_vm_screen_wins_over_the_requested_size(tmp_path):
    """The VM's own screen (docker's image: 1920x1080) sets the desktop size and DesktopEnv's
    setup placeholders, whatever size was asked for."""
    from legato_pipelines.desktops.osworld_worker.desktop import OSWorldDesktop
    from legato_pipelines.desktops.server.desktop import ServerProcess
    from legato_pipelines.tasks import Task

    config = osworld_config(tmp_path)
    request = {"provider": "local", "screen": [1920, 1080], "cache_dir": str(tmp_path / "c")}
    desktop = OSWorldDesktop(
        "osworld-size",
        config,
        python=config.options["osworld_python"],
        start_request=request,
        work_dir=str(tmp_path / "work"),
        vm_server=ServerProcess(width=800, height=600),
    )
    task = Task(
        task_id="screen-size",
        domain=None,
        source="inline",
        config={
            "instruction": "nothing",
            "config": [
                {
                    "type": "execute",
                    "parameters": {
                        "command": "echo {SCREEN_WIDTH}x{SCREEN_HEIGHT} > s.txt",
                        "shell": True,
                    },
                }
            ],
            "evaluator": {
                "func": "exact_match",
                "result": {"type": "vm_command_line", "command": "cat s.txt", "shell": True},
                "expected": {"type": "rule", "rules": {"expected": "800x600\n"}},
            },
        },
    )
    await desktop.start()
    try:
        assert desktop.screen_size == (800, 600)
        assert (await desktop.observe()).width == 800
        await desktop.reset(task)
        assert (await desktop.evaluate(task)).reward == 1.0
    finally:
        await desktop.close()


@pytest.mark.skipif(shutil.which("soffice") is None, reason="needs LibreOffice Calc")
async def test_vm_fast_reset_kills_the_domains_apps_and_restores_home(tmp_path):
    """``fast_mode=vm``, the fast reset every VM provider uses (kill the domain's apps through
    ``/setup/execute``, verify, restore the HOME baseline), on a real desktop with LibreOffice."""
    tasks, scripts = suite_tasks(), suite_scripts()
    task = tasks["local-calc-edit-cell"]
    [desktop] = await open_desktops(osworld_config(tmp_path, fast_mode="vm"), 1)
    client = desktop.vm_server and DesktopClient(desktop.vm_server.url, desktop.vm_server.token)
    try:
        kind, good = await run_script(desktop, task, scripts["correct"][task.instruction])
        assert (kind, good.reward, good.error) == ("fast", 1.0, None)
        await client.execute("touch ~/left-behind", shell=True)

        async def soffice() -> set[int]:
            return {
                p["pid"] for p in (await client.processes())["task"] if p["comm"] == "soffice.bin"
            }

        before = await soffice()
        assert len(before) == 1
        assert await desktop.reset(task) == "fast"
        assert desktop.last_reset["clean_s"] > 0
        after = await soffice()
        assert len(after) == 1 and not after & before  # killed; the setup opened a new one
        left = await client.execute("test -e ~/left-behind && echo yes || echo no", shell=True)
        assert left["output"].strip() == "no"
        _, bad = await run_script(desktop, task, scripts["wrong"][task.instruction])
        assert bad.reward < 1.0 and bad.error is None
    finally:
        await client.aclose()
        await desktop.close()


async def test_stopping_a_worker_stuck_in_a_desktop_env_sleep_is_prompt(tmp_path):
    """SIGTERM during one of DesktopEnv's sleeps (here WAIT's): the worker closes its VM and
    exits at once (no waiting out the grace period), and the desktop recovers."""
    import asyncio
    import time

    task = suite_tasks()["local-term-mkdir"]
    [desktop] = await open_desktops(osworld_config(tmp_path), 1)
    try:
        await desktop.reset(task)
        worker = desktop.worker
        stuck = asyncio.create_task(worker.call("step", 60, code="WAIT", pause=30))
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        await worker.stop(grace=20)
        assert time.perf_counter() - t0 < 3
        with pytest.raises(DesktopError) as err:
            await stuck
        assert err.value.kind == "transport"
        await desktop.recover()
        assert desktop.worker.pid != worker.pid
        assert await desktop.reset(task) == "revert"
        assert (await desktop.evaluate(task)).reward == 0.0
    finally:
        await desktop.close()


async def test_osworld_e0df059f_on_the_sandboxed_local_provider(tmp_path):
    """OSWorld's own SetupController and evaluator on a sandboxed local desktop: the setup's
    ``echo {CLIENT_PASSWORD} | sudo -S mkdir`` works (root inside the sandbox), doing nothing
    scores 0 and the rename scores 1, as on the ``local`` backend."""
    task = osworld_task("e0df059f")
    [desktop] = await open_desktops(osworld_config(tmp_path), 1)
    client = DesktopClient(desktop.vm_server.url, desktop.vm_server.token)
    try:
        health = await client.health()
        assert health["user"] == "user" and health["sandbox"]["home"] == "/home/user"
        await desktop.reset(task)
        owner = await client.execute("stat -c %U ~/Desktop/todo_list_Jan_1", shell=True)
        assert owner["output"].strip() == "root"
        assert (await desktop.evaluate(task)).reward == 0.0
        mv = "mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"
        assert (await client.execute(mv, shell=True))["returncode"] == 0
        assert (await desktop.evaluate(task)).reward == 1.0
    finally:
        await client.aclose()
        await desktop.close()


async def test_model_size_observation_is_the_collector_resize_of_the_vm_screen(tmp_path):
    """Through DesktopEnv on a real screen (an editor open): what the engine gets from
    observe(size=) is byte for byte what the collector-side path makes of the full screenshot.
    The worker resizes only when its Pillow and imagecodecs are the collector's
    (``images.png_codecs``); the full OSWorld recipe keeps desktop-env's own pin (Pillow~=11.0),
    and then the VM's own PNG comes back for the collector to resize."""
    import subprocess

    from legato_pipelines.desktops.osworld_worker import channel
    from legato_pipelines.harness import Harness
    from legato_pipelines.harness.resize import resize_screenshot
    from legato_pipelines.images import png_codecs

    worker = str(channel.WORKER_SCRIPT)
    probe = f"import runpy; print(runpy.run_path({worker!r})['_images'].png_codecs())"
    worker_codecs = subprocess.run(
        [osworld_python(), "-I", "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()

    task = suite_tasks()["local-edit-append"]
    [desktop] = await open_desktops(osworld_config(tmp_path), 1)
    try:
        await desktop.reset(task)
        await desktop.wait_after_reset()
        for variant in ("qwen3vl", "qwen25vl"):
            rule = Harness(variant=variant).resize_rule
            size = rule.size(*desktop.screen_size)
            assert size != desktop.screen_size
            for _ in range(20):  # a screen that did not change around the model-size grab
                full = await desktop.observe()
                shot = await desktop.observe(size)
                if (await desktop.observe()).png == full.png:
                    break
            assert shot.size == (size if worker_codecs == png_codecs() else full.size)
            engine_gets = shot if shot.size == size else resize_screenshot(shot, rule)
            assert engine_gets.png == resize_screenshot(full, rule).png
    finally:
        await desktop.close()


async def test_setup_failures_are_the_same_facts_on_both_backends(tmp_path):
    """Steps OSWorld logs and carries on after are facts (``setup_failures``) on the osworld
    backend as on the local one: a failing command, a launch that dies at once (xterm exits 0
    when its command fails), an ``open`` of a missing file; the next step still runs."""
    from legato_pipelines.desktops.server.desktop import open_local_desktops
    from legato_pipelines.tasks import Task

    task = Task(
        task_id="setup-facts",
        domain=None,
        source="inline",
        config={
            "instruction": "nothing",
            "config": [
                {"type": "execute", "parameters": {"command": "no-such-cmd-xyz", "shell": True}},
                {"type": "launch", "parameters": {"command": ["xterm", "-e", "false"]}},
                {"type": "open", "parameters": {"path": "/home/user/missing-xyz.txt"}},
                {
                    "type": "execute",
                    "parameters": {"command": "echo ok > ~/after.txt", "shell": True},
                },
            ],
            "evaluator": {
                "func": "exact_match",
                "result": {"type": "vm_command_line", "command": "cat ~/after.txt", "shell": True},
                "expected": {"type": "rule", "rules": {"expected": "ok\n"}},
            },
        },
    )
    expected = [(0, "execute", 127), (1, "launch", 0), (2, "open", None)]
    [local] = await open_local_desktops(DesktopConfig(backend="local"), 1)
    [osworld] = await open_desktops(osworld_config(tmp_path), 1)
    try:
        for desktop in (local, osworld):
            await desktop.reset(task)
            facts = [(f["step"], f["type"], f["exit_status"]) for f in desktop.setup_failures]
            assert facts == expected, (desktop, desktop.setup_failures)
            assert "missing-xyz.txt" in desktop.setup_failures[2]["error"]
            assert (await desktop.evaluate(task)).reward == 1.0
    finally:
        await local.close()
        await osworld.close()
