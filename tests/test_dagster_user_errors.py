"""User mistakes around the Dagster layer are one clear line naming the setting and the fix:
``legato demo``'s inputs (checked before any Dagster run), the code location's environment,
the checkpoint sensor without a source."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.errors import ConfigError
from legato_pipelines.resources.defaults import default_resources
from legato_pipelines.sensors import checkpoint_sensor
from tests.engine_support import fake_tasks


def _demo(tmp_path, *args: str):
    out = CliRunner().invoke(app, ["demo", "--home", str(tmp_path / "home"), *args])
    text = " ".join(out.output.split())  # rich may wrap
    return out, text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--version", "bad/ver sion"], "--version: policy_version 'bad/ver sion'"),
        (
            ["--group", "0"],
            "group: attempts per task must be an integer >= 1, got 0 (fix: --group)",
        ),
        (["--max-steps", "0"], "(fix: --max-steps)"),
        (["--desktops", "0"], "(fix: --desktops)"),
    ],
)
def test_demo_refuses_bad_flags_before_dagster_starts(tmp_path, args, needle):
    out, text = _demo(tmp_path, *args)
    assert out.exit_code == 2, out.output
    assert text.startswith("error: ") and needle in text
    assert "Traceback" not in out.output and "dagster asset materialize" not in text
    assert not (tmp_path / "home").exists()  # nothing started, no instance made


def test_demo_refuses_a_broken_task_file_with_the_engine_message(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(2))[:-1] + ",]")  # a trailing comma
    out, text = _demo(tmp_path, "--tasks", str(tasks))
    assert out.exit_code == 2, out.output
    assert f"tasks: '{tasks}' is not valid JSON (trailing comma" in text
    assert not (tmp_path / "home").exists()
    out, text = _demo(tmp_path, "--tasks", str(tmp_path / "nope.json"))
    assert out.exit_code == 2 and "(fix: pass --tasks PATH or set LEGATO_TASKS)" in text


@pytest.mark.parametrize(
    ("name", "value", "valid"),
    [
        ("LEGATO_BACKEND", "fkae", "fake, local, osworld"),
        ("LEGATO_CHECKPOINT_SOURCE", "modls", "directory, models"),
    ],
)
def test_a_bad_choice_in_the_environment_names_the_variable_and_the_valid_values(
    monkeypatch, name, value, valid
):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        default_resources()
    assert str(caught.value) == (
        f"{name}={value!r} is not a valid {name.split('_')[-1].lower()} "
        f"(fix: set {name} to one of {valid}, or unset it for the default)"
    )
    monkeypatch.setenv(name, valid.split(", ")[-1])
    assert default_resources()  # every valid value is accepted


def test_the_sensor_without_a_checkpoints_directory_skips_saying_what_to_set(monkeypatch):
    monkeypatch.delenv("LEGATO_CHECKPOINTS", raising=False)
    monkeypatch.delenv("LEGATO_CHECKPOINT_SOURCE", raising=False)
    resources = default_resources()
    with dg.instance_for_test() as instance:
        for _ in range(2):  # every tick, not only the first
            context = dg.build_sensor_context(
                instance=instance,
                resources={"checkpoints": resources["checkpoints"], "policy": resources["policy"]},
            )
            result = checkpoint_sensor(context)
            assert isinstance(result, dg.SkipReason)
            assert "fix: set LEGATO_CHECKPOINTS" in result.skip_message
            assert "LEGATO_CHECKPOINT_SOURCE=models" in result.skip_message


@pytest.mark.slow
def test_a_partition_added_by_hand_with_an_invalid_key_fails_before_collecting(tmp_path):
    # The UI or add_dynamic_partitions accept any key; the run names it and the fix at once.
    from legato_pipelines.assets import ASSETS, policy_versions
    from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource

    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(1)))
    key = "step-5_lr=3e-6"
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(policy_versions.name, [key])
        result = dg.materialize(
            ASSETS,
            partition_key=key,
            instance=instance,
            resources={
                "policy": PolicyResource(base_url="http://127.0.0.1:9", model="unused"),
                "desktops": DesktopPoolResource(backend="fake", desktops=1),
                "lake": LakeResource(root=str(tmp_path / "lake")),
            },
            run_config={"ops": {"rollout_batch": {"config": {"tasks": str(tasks)}}}},
            raise_on_error=False,
        )
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert f"Dagster partition policy_version={key!r}: policy_version {key!r}: '='" in error
    assert "(fix: use 'step-5_lr-3e-6')" in error and "add that key as a new" in error
    assert not (tmp_path / "lake").exists()  # nothing collected, nothing written


def test_collect_refuses_an_invalid_version_key_naming_the_flag(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(1)))
    out = CliRunner().invoke(
        app,
        ["collect", "--backend", "fake", "--tasks", str(tasks), "--policy-url",
         "http://127.0.0.1:9", "--model", "m", "--version", "step-5_lr=3e-6",
         "--out", str(tmp_path / "run"), "--no-progress"],
    )  # fmt: skip
    text = " ".join(out.output.split())
    assert out.exit_code == 2, out.output
    assert text.startswith("error: --version: policy_version 'step-5_lr=3e-6': '='")
    assert "(fix: use 'step-5_lr-3e-6')" in text and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_bad_knob_in_the_run_config_is_the_clis_config_error(tmp_path):
    """Run config ``{"group": 0}`` fails in the step with the ConfigError the CLI gives
    (the knob, its rule, the fix, the Dagster setting), not pydantic's raw ValidationError."""
    from legato_pipelines.assets import ASSETS, policy_versions
    from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource

    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(1)))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
        result = dg.materialize(
            ASSETS,
            partition_key="step-1",
            instance=instance,
            resources={
                "policy": PolicyResource(base_url="http://127.0.0.1:9", model="unused"),
                "desktops": DesktopPoolResource(backend="fake", desktops=1),
                "lake": LakeResource(root=str(tmp_path / "lake")),
            },
            run_config={"ops": {"rollout_batch": {"config": {"tasks": str(tasks), "group": 0}}}},
            raise_on_error=False,
        )
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert error.cls_name == "ConfigError", error.to_string()
    assert error.message.startswith(
        "legato_pipelines.errors.ConfigError: group: attempts per task must be an integer >= 1, "
        "got 0 (fix: --group) (in Dagster: the rollout_batch run config's group)"
    )
    assert not (tmp_path / "lake").exists()  # nothing collected, nothing written
