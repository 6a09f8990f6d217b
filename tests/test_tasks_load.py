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
