"""Collection settings have one home (``legato_pipelines.rollout.settings.CollectSettings``):
the ``legato collect`` flags, Dagster's ``CollectConfig`` (and the desktops resource for the
resource settings) cover the same settings with the same defaults, run.json's knobs and the
resume check derive from it, and a bad value names the setting and the fix."""

from __future__ import annotations

import orjson
import pytest
import typer

from legato_pipelines import ConfigError, DesktopConfig, PolicyConfig, ResumeError, collect
from legato_pipelines.assets.advice import dagster_advice
from legato_pipelines.assets.config import RESOURCE_SETTINGS, CollectConfig
from legato_pipelines.cli import app
from legato_pipelines.resources.desktops import DesktopPoolResource
from legato_pipelines.rollout.engine import RESUME_KNOBS
from legato_pipelines.rollout.settings import RESUME_SETTINGS, CollectSettings, flag
from legato_pipelines.tasks import load_tasks
from tests.engine_support import fake_tasks

FIELDS = CollectSettings.model_fields


def _collect_params() -> dict:
    command = typer.main.get_command(app).commands["collect"]
    return {p.name: p for p in command.params}


def test_cli_flags_cover_every_setting_with_its_default():
    params = _collect_params()
    for name, field in FIELDS.items():
        param = params.get(name)
        assert param is not None, f"legato collect has no flag for setting {name}"
        dashed = name.replace("_", "-")
        assert param.opts == [f"--{dashed}"], name
        assert param.default == field.default, name
        assert param.help == field.description, name
        if field.annotation is bool:
            assert param.secondary_opts == [f"--no-{dashed}"], name
    # the flags the engine's errors name exist
    for name in FIELDS:
        assert flag(name) in {o for p in params.values() for o in p.opts + p.secondary_opts}


def test_dagster_config_covers_every_setting_with_its_default():
    config_fields = CollectConfig.model_fields
    assert set(config_fields) - set(FIELDS) == {"tasks", "model", "adapter"}
    for name, field in FIELDS.items():
        if name in RESOURCE_SETTINGS:
            key, attr = RESOURCE_SETTINGS[name]
            assert key == "desktops" and name not in config_fields
            assert DesktopPoolResource.model_fields[attr].default == field.default, name
            continue
        mine = config_fields[name]
        assert (mine.annotation, mine.default, mine.description) == (
            field.annotation,
            field.default,
            field.description,
        ), name
        # bounds are the step's check (CollectSettings.checked: a ConfigError naming the fix)
        assert mine.metadata == [], name
    # and the launchpad's schema shows them with those defaults
    schema = CollectConfig.to_config_schema().as_field().config_type.fields
    for name, field in FIELDS.items():
        if name not in RESOURCE_SETTINGS:
            assert schema[name].default_value == field.default or (
                field.default is None and not schema[name].default_provided
            ), name


def test_the_cli_and_dagster_build_the_same_settings():
    from_dagster = CollectConfig(group=2, max_steps=3, fixed_wait=None).settings(desktops=5)
    assert from_dagster == CollectSettings(group=2, max_steps=3, desktops=5)
    assert CollectSettings.checked(
        CollectConfig().model_dump(exclude={"tasks", "model", "adapter"})
    ) == (CollectSettings())


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"group": 0}, "group: attempts per task must be an integer >= 1, got 0 (fix: --group)"),
        ({"oversample": -1}, "oversample: must be >= 0 (a fraction of group), got -1"),
        ({"max_inflight": 0}, "max_inflight: must be >= 1 or unset, got 0 (fix: --max-inflight)"),
        ({"rollout_timeout": 0}, "rollout_timeout: must be > 0 seconds or unset, got 0"),
        ({"desktops": 0}, "desktops: must be >= 1, got 0 (fix: --desktops)"),
        ({"harness": "gpt"}, "harness: must be qwen3vl or qwen25vl, got 'gpt' (fix: --harness)"),
    ],
)
def test_a_bad_setting_names_the_field_and_the_fix(knobs, message):
    with pytest.raises(ConfigError) as info:
        CollectSettings.checked(knobs)
    assert message in str(info.value)
    # in a Dagster run, the same message also names the run config field or the resource
    advice = dagster_advice(str(info.value))
    name = next(iter(knobs))
    expected = "LEGATO_DESKTOPS" if name == "desktops" else f"the rollout_batch run config's {name}"
    assert expected in advice
    assert "ready_signal" in dagster_advice("fix: --no-ready-signal")


def test_resume_settings_are_marked_on_the_model():
    assert set(RESUME_SETTINGS) == {
        "group",
        "oversample",
        "max_steps",
        "image_max",
        "harness",
        "history",
        "seed",
    }
    assert set(RESUME_KNOBS) == set(RESUME_SETTINGS) | {"backend", "grader"}


def test_collect_keywords_map_onto_the_settings(policy_server, tmp_path):
    tasks = load_tasks(fake_tasks(1))
    policy = PolicyConfig(
        base_url=policy_server.url, model=policy_server.model, version="v", step_timeout=30
    )
    settings = CollectSettings(group=1, max_steps=2, desktops=1, image_max=4)
    collect(tasks, policy, tmp_path, settings=settings, desktop=DesktopConfig(backend="fake"))
    knobs = orjson.loads((tmp_path / "run.json").read_bytes())["knobs"]
    # run.json's knobs: the settings in their order, the policy's step_timeout (not set here),
    # the spares the batch ran with (unset: none for one desktop)
    expected = settings.model_copy(update={"step_timeout": 30.0, "spares": 0})
    assert knobs == expected.knobs(backend="fake", desktops=1)
    assert list(knobs) == [*list(FIELDS)[:-3], "backend", "desktops", "spares", "seed"]
    # keywords override settings=; the resume check reads the settings' resume fields
    with pytest.raises(ResumeError, match="image_max"):
        collect(tasks, policy, tmp_path, settings=settings, image_max=5)
    with pytest.raises(TypeError, match="max_stepz"):
        collect(tasks, policy, tmp_path, max_stepz=2)
    with pytest.raises(ConfigError, match=r"group: .* \(fix: --group\)"):
        collect(tasks, policy, tmp_path, settings=settings, group=0)


def test_harness_and_history_names_match_without_case():
    """``--harness Qwen25VL`` is the qwen25vl harness (a newcomer's ``Qwen3VL`` was refused);
    a name that is none of them is still refused by name."""
    from pydantic import ValidationError

    from legato_pipelines.rollout.settings import CollectSettings

    settings = CollectSettings(harness=" Qwen25VL", history="HYSTERESIS")
    assert (settings.harness, settings.history) == ("qwen25vl", "hysteresis")
    with pytest.raises(ValidationError, match="harness"):
        CollectSettings(harness="qwen2vl")
