"""classify_task over the 369 real OSWorld task configs and the local suite."""

from __future__ import annotations

import orjson
import pytest

from legato_pipelines.osworld_format import (
    BackendSupport,
    classify_task,
    needs_full_reset,
    summarize,
)
from legato_pipelines.osworld_format.classify import KNOWN_OUTSIDE_HOME
from legato_pipelines.tasks import Task, load_tasks
from tests.osworld_data import LOCAL_SUITE, OSWORLD


@pytest.fixture(scope="module")
def osworld_classes():
    task_set = load_tasks(OSWORLD / "test_all.json", osworld=OSWORLD)
    return task_set, [classify_task(t) for t in task_set]


def inline(setup=(), evaluator=None, task_id="t", **extra):
    config = {
        "instruction": "x",
        "config": list(setup),
        "evaluator": evaluator or {"func": "infeasible"},
        **extra,
    }
    return Task(task_id=task_id, domain=None, config=config, source="inline")


def test_every_osworld_task_is_classified(osworld_classes):
    task_set, classes = osworld_classes
    index = orjson.loads((OSWORLD / "test_all.json").read_bytes())
    assert len(classes) == sum(len(ids) for ids in index.values()) == len(task_set)
    totals = summarize(classes)
    assert totals.fast_reset_eligible + totals.full_reset == totals.tasks
    assert totals.by_backend["fake"] == totals.tasks
    assert totals.by_domain == {domain: len(ids) for domain, ids in sorted(index.items())}
    # classification is deterministic: a second pass gives the same answers
    assert [classify_task(t) for t in task_set] == classes


def test_section6_tasks_need_a_full_reset(osworld_classes):
    task_set, classes = osworld_classes
    by_id = {c.task_id: c for c in classes}
    listed = [tid for tid in by_id if any(tid.startswith(p) for p in KNOWN_OUTSIDE_HOME)]
    assert len(listed) == len(KNOWN_OUTSIDE_HOME)  # every docs/osworld.md §6 id is in the data
    assert all(
        by_id[tid].changes_outside_home and not by_id[tid].fast_reset_eligible for tid in listed
    )
    for task in task_set:  # the function agrees with the class
        assert needs_full_reset(task) == by_id[task.task_id].changes_outside_home
    # the heuristics alone find the os tasks whose commands use sudo / gsettings
    for task in task_set:
        text = orjson.dumps(task.config).decode()
        if task.domain == "os" and ("sudo " in text or "gsettings" in text):
            assert by_id[task.task_id].changes_outside_home, task.task_id


def test_internet_and_evaluator_support_agree_with_the_raw_configs(osworld_classes):
    task_set, classes = osworld_classes
    by_id = {c.task_id: c for c in classes}
    for task in task_set:
        c = by_id[task.task_id]
        steps = task.setup + list(task.evaluator.get("postconfig") or [])
        urls = [
            f["url"] for s in steps if s["type"] == "download" for f in s["parameters"]["files"]
        ]
        assert set(urls) <= set(c.internet_urls)
        if urls or any(s["type"] == "chrome_open_tabs" for s in steps) or task.config.get("proxy"):
            assert c.needs_internet and "local" not in c.backends
        funcs = task.evaluator["func"]
        funcs = funcs if isinstance(funcs, list) else [funcs]
        if funcs == ["infeasible"]:
            assert c.evaluator_supported_locally
        if any(f in ("compare_pptx_files", "compare_docx_files") for f in funcs):
            assert not c.evaluator_supported_locally and "osworld" in c.backends


def test_a_file_cache_removes_the_internet_need(osworld_classes, tmp_path):
    task_set, classes = osworld_classes
    task = next(
        t
        for t, c in zip(task_set, classes, strict=True)
        if c.internet_urls
        and not c.internet_reasons
        and all("huggingface.co" in u for u in c.internet_urls)
    )
    before = classify_task(task)
    for url in before.internet_urls:
        (tmp_path / url.rsplit("/", 1)[-1]).write_bytes(b"cached")
    after = classify_task(task, backend_support=BackendSupport(cache_dir=tmp_path))
    assert before.needs_internet and not after.needs_internet and after.internet_urls == []


def test_local_suite_runs_everywhere_with_fast_reset():
    classes = [classify_task(t) for t in load_tasks(LOCAL_SUITE)]
    assert len(classes) >= 12
    assert {a for c in classes for a in c.apps} == {"terminal", "text_editor", "libreoffice_calc"}
    for c in classes:
        assert c.backends == ["local", "osworld", "fake"], (c.task_id, c.local_blockers)
        assert c.fast_reset_eligible and not c.needs_internet and c.evaluator_supported_locally


def test_heuristics_on_inline_tasks():
    plain = inline(
        [
            {
                "type": "execute",
                "parameters": {"command": "mkdir -p ~/a && touch ~/a/b", "shell": True},
            }
        ]
    )
    assert not needs_full_reset(plain)
    for command, reason in [
        ("echo {CLIENT_PASSWORD} | sudo -S true", "sudo"),
        ("gsettings set org.gnome.desktop.interface clock-format 12h", "gsettings/dconf"),
        ("mkdir -p /tmp/test_files", "/tmp"),
    ]:
        c = classify_task(
            inline([{"type": "execute", "parameters": {"command": command, "shell": True}}])
        )
        assert c.changes_outside_home and reason in c.outside_home_reasons, command
    # an evaluator that reads system state means the agent is to change it
    reads = inline(evaluator={"func": "exact_match", "result": {"type": "vm_command_line", "command": "timedatectl"},
                              "expected": {"type": "rule", "rules": {"expected": "x"}}})  # fmt: skip
    assert needs_full_reset(reads)
    # an XML namespace in a printf is not a download; a browser launch is
    xml = inline(
        [
            {
                "type": "execute",
                "parameters": {
                    "command": "printf '<a xmlns=\"http://openoffice.org/2001/registry\"/>' > a.xcu",
                    "shell": True,
                },
            }
        ]
    )
    assert not classify_task(xml).needs_internet
    browse = inline(
        [{"type": "launch", "parameters": {"command": ["google-chrome", "https://example.org/"]}}]
    )
    c = classify_task(browse)
    assert (
        c.internet_urls == ["https://example.org/"]
        and "chrome" in c.apps
        and "local" not in c.backends
    )
    custom = inline(
        [{"type": "upload", "parameters": {"files": [{"path": "~/a", "content": "x"}]}}]
    )
    assert classify_task(custom).backends == ["local", "fake"]  # OSWorld has no "upload" step type


def test_a_misspelled_setup_parameter_is_a_counted_local_blocker():
    """A step the verdict refuses for its parameters ('comand') is a local blocker too, so
    ``tasks check``'s totals have a row for it (they listed none: newcomer)."""
    typo = inline([{"type": "execute", "parameters": {"comand": "ls", "shell": True}}])
    c = classify_task(typo)
    assert "local" not in c.backends
    assert "setup step parameters" in c.local_blockers
    assert summarize([c]).top_local_blockers == {"setup step parameters": 1}
    fine = classify_task(inline([{"type": "execute", "parameters": {"command": "ls"}}]))
    assert "setup step parameters" not in fine.local_blockers
    # a download the file cache lacks names a parameter's url too: it needs the internet, its
    # parameters are right (the totals counted 264 OSWorld tasks as misspelled: newcomer)
    download = {"files": [{"url": "https://example.org/a.docx", "path": "/home/user/a.docx"}]}
    uncached = classify_task(inline([{"type": "download", "parameters": download}]))
    assert "local" not in uncached.backends
    assert "setup step parameters" not in uncached.local_blockers
