"""Engine errors raised inside a Dagster run name the Dagster setting to change (environment
variable, resource field, run config field) besides the ``legato collect`` flag, and a run
without LEGATO_POLICY_URL fails at once naming the variable."""

from __future__ import annotations

import fcntl
import json
import socket

import dagster as dg
import pytest

from legato_pipelines.assets import ASSETS, policy_versions
from legato_pipelines.assets.advice import dagster_advice
from legato_pipelines.errors import ConfigError, PolicyConfigError, PolicyError, ResumeError
from legato_pipelines.resources import DesktopPoolResource, LakeResource, PolicyResource
from legato_pipelines.resources.defaults import default_resources
from legato_pipelines.store.lake import Lake
from legato_pipelines.store.rundir import LOCK
from tests.engine_support import fake_tasks


def _materialize(tmp_path, policy: PolicyResource, tasks: str, **knobs):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(policy_versions.name, ["step-1"])
        return dg.materialize(
            ASSETS,
            partition_key="step-1",
            instance=instance,
            resources={
                "policy": policy,
                "desktops": DesktopPoolResource(backend="fake", desktops=2),
                "lake": LakeResource(root=str(tmp_path / "lake")),
            },
            run_config={
                "ops": {
                    "rollout_batch": {
                        "config": {"tasks": tasks, "group": 2, "max_steps": 2, **knobs}
                    }
                }
            },
            raise_on_error=False,
        )


def _failure(result) -> tuple[str, str]:
    """(class name, message) of the error that failed the run's step."""
    assert not result.success
    [event] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = event.step_failure_data.error
    while error.cause is not None and error.cls_name == "DagsterExecutionStepExecutionError":
        error = error.cause
    head, _, message = error.message.strip().partition(": ")  # "module.Class: message"
    assert head.endswith(error.cls_name), error.message
    return error.cls_name, message


@pytest.fixture
def tasks_file(tmp_path) -> str:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(fake_tasks(2, success=0.5)))
    return str(path)


def test_advice_names_env_vars_resource_and_run_config_fields_once_each():
    assert dagster_advice("cannot connect (is it running? fix --policy-url)").endswith(
        "fix --policy-url) (in Dagster: LEGATO_POLICY_URL / the policy resource's base_url)"
    )
    assert dagster_advice("x (fix: --model, or --policy-url if the path is wrong)").endswith(
        "(in Dagster: LEGATO_POLICY_MODEL / the policy resource's model; "
        "LEGATO_POLICY_URL / the policy resource's base_url)"
    )
    assert dagster_advice("group: must be >= 1 (fix: --group); --group").endswith(
        "(in Dagster: the rollout_batch run config's group)"
    )
    assert dagster_advice("lower --image-max to 5 or raise the server's --limit-mm-per-prompt") == (
        "lower --image-max to 5 or raise the server's --limit-mm-per-prompt "
        "(in Dagster: the rollout_batch run config's image_max)"
    )
    assert "LEGATO_OSWORLD" in dagster_advice("an OSWorld task needs --osworld DIR")
    assert "LEGATO_OSWORLD" not in dagster_advice("fix: --osworld-python PATH")
    assert dagster_advice("no flag here, only a server's --limit-mm-per-prompt") == (
        "no flag here, only a server's --limit-mm-per-prompt"
    )


@pytest.mark.slow
def test_a_dead_policy_url_in_a_run_names_the_dagster_setting(tmp_path, tasks_file):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    result = _materialize(tmp_path, PolicyResource(base_url=dead, model="m"), tasks_file)
    cls, message = _failure(result)
    assert cls in {PolicyConfigError.__name__, PolicyError.__name__}, (cls, message)
    assert "--policy-url" in message  # the engine's own words are kept
    assert message.endswith("(in Dagster: LEGATO_POLICY_URL / the policy resource's base_url)")


@pytest.mark.slow
def test_a_missing_task_file_in_a_run_names_the_run_config_and_the_variable(
    tmp_path, policy_server
):
    policy = PolicyResource(base_url=policy_server.url, model=policy_server.model)
    result = _materialize(tmp_path, policy, str(tmp_path / "nope.json"))
    cls, message = _failure(result)
    assert cls == "TaskListError" or cls == ConfigError.__name__, (cls, message)
    assert "pass --tasks PATH" in message
    assert "(in Dagster: LEGATO_TASKS / the rollout_batch run config's tasks)" in message


@pytest.mark.slow
def test_a_run_without_legato_policy_url_fails_at_once_naming_it(tmp_path, tasks_file, monkeypatch):
    monkeypatch.delenv("LEGATO_POLICY_URL", raising=False)
    policy = default_resources()["policy"]  # the code location still loads without it
    assert policy.base_url is None
    result = _materialize(tmp_path, policy, tasks_file)
    cls, message = _failure(result)
    assert cls == ConfigError.__name__
    assert message.startswith("policy: no policy server configured (fix: set LEGATO_POLICY_URL")
    assert not (tmp_path / "lake" / "runs").exists()  # nothing collected, no desktop started


@pytest.mark.slow
def test_a_partition_already_collecting_fails_the_second_run_clearly(
    tmp_path, tasks_file, policy_server
):
    """Two runs of one partition at once: the second finds the run directory locked (the
    engine's lock, held here as another collection holds it) and fails at once, saying so,
    without touching the directory; once the lock is released the partition materializes."""
    policy = PolicyResource(base_url=policy_server.url, model=policy_server.model)
    run_dir = Lake(tmp_path / "lake").run_dir("step-1")
    run_dir.mkdir(parents=True)
    with open(run_dir / LOCK, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(b"4242")
        held.flush()
        result = _materialize(tmp_path, policy, tasks_file)
        cls, message = _failure(result)
        assert cls == ResumeError.__name__
        assert f"out: {run_dir} is in use by another collection (pid 4242)" in message
        assert message.endswith(
            "(in Dagster: another run of this policy_version partition is collecting into its "
            "run directory: wait for it to finish, or cancel it (Runs), then materialize the "
            "partition again)"
        )
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # nothing written
        failed = {e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"}
        assert failed == {"rollout_batch"}
    assert _materialize(tmp_path, policy, tasks_file).success
