"""``--desktop-option cache_dir=...`` reaches the evaluator as a path, however it is spelled.

Real parts: a local desktop server on Xvfb (the ``local`` backend), the task's setup and
OSWorld-format evaluation over its API, a ``cache_file`` getter reading the file cache.
Before the fix the option stayed a ``str`` and every ``cache_file`` evaluation raised
``TypeError`` (``str / str``), scored 0.
"""

from __future__ import annotations

import pytest

from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.option_flags import parse_desktop_options
from legato_pipelines.errors import ConfigError
from legato_pipelines.osworld_format.sources import cache_dir_path
from legato_pipelines.tasks import Task
from tests.desktop_local_support import needs_xvfb

pytestmark = [needs_xvfb, pytest.mark.desktop]


def cache_task(task_id: str) -> Task:
    """Setup writes ``answer.txt``; the evaluator compares it with the cached ``expected.txt``."""
    config = {
        "id": task_id,
        "instruction": "nothing to do",
        "config": [
            {
                "type": "execute",
                "parameters": {"command": "printf 'forty two\\n' > answer.txt", "shell": True},
            }
        ],
        "evaluator": {
            "func": "compare_text_file",
            "result": {"type": "vm_file", "path": "~/answer.txt", "dest": "answer.txt"},
            "expected": {"type": "cache_file", "path": "expected.txt"},
        },
    }
    return Task(task_id=task_id, domain=None, config=config, source="inline")


@pytest.mark.parametrize("spelling", ["json", "bare"])
async def test_cache_dir_option_as_a_string_grades_a_cache_file_task(tmp_path, spelling):
    cache = tmp_path / "cache"
    task = cache_task(f"cache-{spelling}")
    (cache / task.task_id).mkdir(parents=True)
    (cache / task.task_id / "expected.txt").write_text("forty two\n")
    value = f'"{cache}"' if spelling == "json" else str(cache)
    options = parse_desktop_options([f"cache_dir={value}"])
    assert options == {"cache_dir": str(cache)}  # a str, as the CLI hands it over
    (desktop,) = await open_desktops(DesktopConfig(backend="local", options=options), 1)
    try:
        await desktop.reset(task)
        await desktop.wait_after_reset()
        evaluation = await desktop.evaluate(task)
        assert (evaluation.reward, evaluation.error) == (1.0, None)
        # a different cached answer scores 0 without an error: the file really was compared
        # (the task's files are taken from the cache at its setup, as OSWorld's host does)
        (cache / task.task_id / "expected.txt").write_text("forty three\n")
        await desktop.reset(task)
        await desktop.wait_after_reset()
        evaluation = await desktop.evaluate(task)
        assert (evaluation.reward, evaluation.error) == (0.0, None)
    finally:
        await desktop.close()


def test_cache_dir_path_expands_home_and_refuses_non_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir_path("~/c") == tmp_path / "c"
    assert cache_dir_path(None) is None and cache_dir_path("") is None
    with pytest.raises(ConfigError, match="cache_dir"):
        cache_dir_path(42)
    with pytest.raises(ValueError, match="KEY=JSON"):
        parse_desktop_options(["cache_dir"])
