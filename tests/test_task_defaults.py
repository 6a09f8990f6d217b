"""Desktop defaults derived from the task set (desktops/task_defaults.py): OSWorld's tasks get
the VM's 1920x1080 screen and, on the local backend, its look (``session=vm``), unless set."""

from __future__ import annotations

import json
from pathlib import Path

from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.task_defaults import for_tasks
from legato_pipelines.tasks import load_tasks

OSWORLD = Path(__file__).resolve().parent / "data" / "osworld"
TASK = ("ec4e3f68-9ea4-4c18-a5c9-69f89d1178b3", "os")


def _osworld_tasks(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"task_id": TASK[0], "domain": TASK[1]}]))
    return load_tasks(path, osworld=OSWORLD).tasks


def _inline_tasks(tmp_path):
    config = json.loads((OSWORLD / TASK[1] / f"{TASK[0]}.json").read_text())
    path = tmp_path / "inline.json"
    path.write_text(json.dumps([{"task_id": TASK[0], "domain": TASK[1], "config": config}]))
    return load_tasks(path).tasks


def test_osworld_tasks_get_the_vms_screen_and_look_on_the_local_backend(tmp_path):
    desktop, filled = for_tasks(DesktopConfig(backend="local"), _osworld_tasks(tmp_path))
    assert (desktop.screen_width, desktop.screen_height) == (1920, 1080)
    assert desktop.options == {"session": "vm"}
    assert filled == {"screen": "1920x1080", "session": "vm"}


def test_what_the_config_sets_is_kept(tmp_path):
    tasks = _osworld_tasks(tmp_path)
    given = DesktopConfig(
        backend="local", screen_width=1280, screen_height=720, options={"session": "plain"}
    )
    assert for_tasks(given, tasks) == (given, {})
    # a backend without a session option gets the screen only
    fake, filled = for_tasks(DesktopConfig(backend="fake"), tasks)
    assert (fake.screen_width, fake.options, filled) == (1920, {}, {"screen": "1920x1080"})


def test_inline_configs_keep_the_desktop_defaults(tmp_path):
    plain = DesktopConfig(backend="local")
    assert for_tasks(plain, _inline_tasks(tmp_path)) == (plain, {})
    assert (plain.screen_width, plain.screen_height) == (1280, 720)


async def test_the_engine_applies_them_and_records_them_in_the_knobs(tmp_path):
    from legato_pipelines.policy.config import PolicyConfig
    from legato_pipelines.policy.scripted import ScriptedPolicyServer
    from legato_pipelines.rollout.engine import collect_async

    done = (
        'Action: done.\n<tool_call>\n{"name": "computer_use", "arguments": '
        '{"action": "terminate", "status": "success"}}\n</tool_call>'
    )
    out = tmp_path / "run"
    with ScriptedPolicyServer(flavor="vllm", script={"default": [done]}) as policy:
        _osworld_tasks(tmp_path)  # writes tasks.json
        await collect_async(
            tmp_path / "tasks.json",
            PolicyConfig(base_url=policy.url, model=policy.model),
            out,
            desktops=1,
            group=1,
            max_steps=1,
            desktop=DesktopConfig(backend="fake"),
            osworld=OSWORLD,
        )
    knobs = json.loads((out / "run.json").read_text())["knobs"]
    assert knobs["osworld_defaults"] == {"screen": "1920x1080"}


def test_the_dagster_desktop_pool_leaves_the_screen_to_the_task_set(tmp_path):
    """``DesktopPoolResource`` with no screen set gives the engine an unset screen, so an
    OSWorld task set runs at 1920x1080 under Dagster too; a screen set there is kept."""
    from legato_pipelines.resources import DesktopPoolResource

    tasks = _osworld_tasks(tmp_path)
    desktop, _ = for_tasks(DesktopPoolResource(backend="fake").config(), tasks)
    assert (desktop.screen_width, desktop.screen_height) == (1920, 1080)
    inline = DesktopPoolResource(backend="fake").config()
    assert for_tasks(inline, _inline_tasks(tmp_path))[0].screen_size == (1280, 720)
    set_here = DesktopPoolResource(backend="fake", screen_width=1280, screen_height=720)
    desktop, filled = for_tasks(set_here.config(), tasks)
    assert (desktop.screen_width, desktop.screen_height, filled) == (1280, 720, {})
