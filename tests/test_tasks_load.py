"""load_tasks rejects task lists whose shape the engine cannot use, naming the field and the fix."""

from __future__ import annotations

import pytest

from legato_pipelines.errors import TaskListError
from legato_pipelines.tasks import load_tasks


def test_a_single_task_object_is_not_an_index():
    entry = {"task_id": "t", "config": {"instruction": "x"}}
    with pytest.raises(TaskListError, match=r"must be a list of task entries, or an OSWorld index"):
        load_tasks(entry)
    config = {"instruction": "x", "evaluator": {"func": "infeasible"}}  # a bare task config
    with pytest.raises(TaskListError, match="wrap the entry in"):
        load_tasks(config)
    # an index still loads (its domains resolve under --osworld)
    with pytest.raises(TaskListError, match="needs --osworld"):
        load_tasks({"os": ["abc"]})


@pytest.mark.parametrize("fake", [{"success": 2}, {"success": -1}, {"success": "0.5"},
                                  {"success": True}, {"success": float("nan")}, 0.5])  # fmt: skip
def test_fake_success_must_be_a_probability(fake):
    entry = {"task_id": "f", "config": {"instruction": "x", "fake": fake}}
    with pytest.raises(TaskListError, match=r"tasks\[0\] \(task_id 'f'\): field 'config.fake"):
        load_tasks([entry])


@pytest.mark.parametrize("fake", [{"success": 0}, {"success": 1}, {"success": 0.25}, {}])
def test_fake_success_in_range_loads(fake):
    entry = {"task_id": "f", "config": {"instruction": "x", "fake": fake}}
    assert len(load_tasks([entry])) == 1


TWO_BAD = [
    {"task_id": "good", "config": {"instruction": "x"}},
    {"task_id": "no-instruction", "config": {"evaluator": {"func": "infeasible"}}},
    {"domain": "os"},
]


def test_every_problem_of_the_list_at_once():
    with pytest.raises(TaskListError) as caught:
        load_tasks(TWO_BAD)
    assert caught.value.problems == (
        "tasks[1] (task_id 'no-instruction'): field 'config.instruction' is missing",
        "tasks[2]: field 'task_id' is missing",
    )
    message = str(caught.value)
    assert message.startswith("2 problems in the task list:")
    assert all(problem in message for problem in caught.value.problems)


def test_several_problems_of_one_entry_and_repeats_all_reported():
    entries = [
        {"task_id": "a", "config": {"instruction": " ", "config": [{"parameters": []}]}},
        {"task_id": "b", "config": {"instruction": "x", "fake": {"success": 2}}},
        {"task_id": "b", "config": {"instruction": "y"}},
        "not an entry",
    ]
    with pytest.raises(TaskListError) as caught:
        load_tasks(entries)
    assert caught.value.problems == (
        "tasks[0] (task_id 'a'): field 'config.instruction' must be a non-empty string",
        "tasks[0] (task_id 'a'): field 'config.config[0].type' is missing",
        "tasks[0] (task_id 'a'): field 'config.config[0].parameters' must be an object",
        "tasks[1] (task_id 'b'): field 'config.fake.success' must be a probability "
        "(a number in [0, 1]), got 2 (fix: e.g. 0.5)",
        "tasks[3]: must be an object with 'task_id' and 'domain' or 'config', got str",
    )  # tasks[2] repeats tasks[1], which is itself invalid: only the first repeat is a problem


def test_osworld_file_problems_name_the_file(tmp_path):
    (tmp_path / "os").mkdir()
    (tmp_path / "os" / "t1.json").write_text('{"id": "t1", "config": [], "evaluator": {}}')
    (tmp_path / "os" / "t2.json").write_text('{"id": "t2", "instruction": "x"}')
    entries = [{"task_id": "t1", "domain": "os"}, {"task_id": "t2", "domain": "os"},
               {"task_id": "t3", "domain": "os"}]  # fmt: skip
    with pytest.raises(TaskListError) as caught:
        load_tasks(entries, osworld=tmp_path)
    t1 = tmp_path / "os" / "t1.json"
    assert caught.value.problems[:2] == (
        f"tasks[0] (task_id 't1', file {t1}): field 'config.instruction' is missing",
        f"tasks[0] (task_id 't1', file {t1}): field 'config.evaluator.func' is missing",
    )
    assert caught.value.problems[2].startswith("tasks[2] (task_id 't3'): field 'domain': no task")
    assert len(caught.value.problems) == 3
