"""Policy versions sort by the training step their key carries (issue 17): ``step-50`` before
``step-100`` in ``Lake.versions``, the lake's ``policy_step`` column and the across-versions
chart; keys without a step come after, by name."""

from __future__ import annotations

import pytest

from legato_pipelines.assets.insight import success_across_versions
from legato_pipelines.errors import ConfigError
from legato_pipelines.record import Record
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.lake_tables import Lineage, profile_table, rollouts_table, steps_table
from legato_pipelines.store.rundir import read_typed_records
from legato_pipelines.versions import (
    check_version_key,
    sort_versions,
    suggest_version_key,
    version_step,
)
from tests.lake_synthetic import write_run_dir


@pytest.mark.parametrize(
    ("key", "step"),
    [
        ("step-50", 50),
        ("step_1200", 1200),
        ("ckpt-3", 3),
        ("checkpoint-7", 7),
        ("global_step300", 300),
        ("v2", 2),
        ("42", 42),
        ("run.step-9", 9),
        ("demo-20261201-004900-ab12", None),
        ("Qwen/Qwen3-VL-8B-Instruct", None),
        ("", None),
    ],
)
def test_version_step(key, step):
    assert version_step(key) == step


def test_versions_sort_by_training_step_not_text():
    assert sort_versions(["step-100", "demo-b", "step-50", "step-7", "demo-a"]) == [
        "step-7",
        "step-50",
        "step-100",
        "demo-a",
        "demo-b",
    ]


def test_lake_tables_carry_policy_step_and_sql_sorts_by_it(tmp_path):
    lake = Lake(tmp_path / "lake")
    records: dict[str, list[Record]] = {}
    for seed, version in enumerate(["step-100", "step-50", "step-7"]):  # created in this order
        run = write_run_dir(tmp_path / f"run-{version}", version=version, seed=seed)
        lineage = Lineage(version, run["summary"]["task_set"], f"run-{version}")
        typed = read_typed_records(tmp_path / f"run-{version}")
        records[version] = typed
        lake.write("rollouts", version, rollouts_table(typed, lineage))
        lake.write("steps", version, steps_table(typed, lineage))
        lake.write("profile", version, profile_table(run["summary"], lineage))
    lake.refresh_views()
    assert lake.versions("rollouts") == ["step-7", "step-50", "step-100"]
    for table in ("rollouts", "steps", "profile"):
        got = lake.query(
            f"SELECT DISTINCT policy_version, policy_step FROM {table} ORDER BY policy_step"
        ).to_pylist()
        assert got == [
            {"policy_version": "step-7", "policy_step": 7},
            {"policy_version": "step-50", "policy_step": 50},
            {"policy_version": "step-100", "policy_step": 100},
        ]
    # the across-versions chart's data: every version in the lake, in training order, with
    # the current one from its records
    per_version = success_across_versions(lake, "step-200", records["step-7"])
    assert list(per_version) == ["step-7", "step-50", "step-100", "step-200"]
    assert set(per_version["step-50"]) == {"fake-001", "fake-002"}


@pytest.mark.parametrize(
    "key", ["step-50", "step_1200", "7", "Qwen--Qwen3-VL-8B-Instruct", "run.step-9", "v2"]
)
def test_valid_version_keys(key):
    assert check_version_key(key) == key


@pytest.mark.parametrize(
    ("key", "why", "fix"),
    [
        ("step-5_lr=3e-6", "'=' cannot be in a version key", "step-5_lr-3e-6"),
        ("bad/ver sion", "' ', '/' cannot be in a version key", "bad-ver-sion"),
        ("a...b", "'...' cannot be in a version key", "a.b"),
        ("..", "starts with a letter or a digit", "v"),
        ("x\ny", "'\\n' cannot be in a version key", "x-y"),
        ("s" * 201, "longer than 200 characters", "s" * 200),
    ],
)
def test_invalid_version_keys_name_why_and_a_key_to_use(key, why, fix):
    with pytest.raises(ConfigError) as caught:
        check_version_key(key)
    message = str(caught.value)
    assert message.startswith(f"policy_version {key!r}: ") and why in message
    assert message.endswith(f"(fix: use {fix!r})")
    assert check_version_key(suggest_version_key(key)) == fix


def test_the_lake_refuses_an_invalid_key_before_writing(tmp_path):
    lake = Lake(tmp_path / "lake")
    with pytest.raises(ConfigError, match="'=' cannot be in a version key"):
        lake.run_dir("step-5_lr=3e-6")
    assert not (tmp_path / "lake").exists()
