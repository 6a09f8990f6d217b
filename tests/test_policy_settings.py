"""Issue 35: the policy and load settings are declared once, on the engine's models
(``PolicyConfig``'s sampling fields, ``LoadSpec``), and the ``legato collect`` flags, the
Dagster policy resource's fields and the environment defaults all come from them: a default
changed on the model changes all three, and no consumer holds a copy of a default."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from legato_pipelines.cli.collect import collect_command
from legato_pipelines.policy.config import PolicyConfig
from legato_pipelines.policy.load_spec import LoadSpec
from legato_pipelines.resources.defaults import default_resources
from legato_pipelines.resources.policy import PolicyResource
from legato_pipelines.setting_fields import env_fields, user_settings

ROOT = Path(__file__).resolve().parents[1]
MODELS = (PolicyConfig, LoadSpec)

# The names users rely on (flags, resource fields, variables): an interface, pinned here.
CLI_NAMES = [
    "version", "temperature", "top_p", "max_tokens", "sampling_seed", "logprobs_mode",
    "load", "load_server", "load_keep", "weights_route", "weights_payload", "load_timeout",
    "load_wait",
]  # fmt: skip
DAGSTER_NAMES = [n for n in CLI_NAMES if n != "version"] + ["extra_body"]
ENV_NAMES = {
    "LEGATO_POLICY_LOAD": "load",
    "LEGATO_POLICY_SERVER": "load_server",
    "LEGATO_POLICY_LOAD_KEEP": "load_keep",
    "LEGATO_POLICY_WEIGHTS_ROUTE": "weights_route",
    "LEGATO_POLICY_WEIGHTS_PAYLOAD": "weights_payload",
    "LEGATO_POLICY_LOAD_TIMEOUT": "load_timeout",
    "LEGATO_POLICY_LOAD_WAIT": "load_wait",
}


def _declared(where: str) -> dict:
    return {
        name: field.get_default(call_default_factory=True)
        for model in MODELS
        for name, (_, field) in user_settings(model, where).items()
    }


@pytest.fixture
def no_policy_env(monkeypatch):
    for name in os.environ:
        if name.startswith("LEGATO_POLICY_") and name != "LEGATO_POLICY_KEY":
            monkeypatch.delenv(name)


def test_the_names_users_set_are_unchanged():
    assert sorted(_declared("cli")) == sorted(CLI_NAMES)
    assert sorted(_declared("dagster")) == sorted(DAGSTER_NAMES)
    variables = {var: info for m in MODELS for var, (_, info) in env_fields(m).items()}
    assert set(variables) == set(ENV_NAMES)
    for var, name in ENV_NAMES.items():  # each variable sets the resource field it always set
        assert PolicyResource.model_fields[name].description.endswith(f" ({var}).")
    flags = {p.name for p in inspect.signature(collect_command).parameters.values()}
    assert set(CLI_NAMES) <= flags
    assert set(DAGSTER_NAMES) <= set(PolicyResource.model_fields)


def test_flag_field_and_environment_defaults_are_the_models(no_policy_env):
    """Compared programmatically: every flag's default, every resource field's default and
    the value the environment gives a resource when no variable is set, against the model."""
    params = inspect.signature(collect_command).parameters
    for name, default in _declared("cli").items():
        expected = json.dumps(default) if isinstance(default, dict) else default
        assert params[name].default == expected, name
    resource = default_resources()["policy"]
    for name, default in _declared("dagster").items():
        field = PolicyResource.model_fields[name]
        assert field.get_default(call_default_factory=True) == default, name
        assert getattr(resource, name) == default, name
        described = PolicyResource.model_fields[name].description
        declared = next(
            f.description
            for m in MODELS
            for n, (_, f) in user_settings(m, "dagster").items()
            if n == name
        )
        assert described.startswith(declared.rstrip(".")), name
    # the resource's engine objects come back with the model's defaults
    assert resource.load_spec("step-1") == LoadSpec()
    config = PolicyResource(base_url="http://127.0.0.1:9", model="m").config("v1")
    assert config == PolicyConfig(base_url="http://127.0.0.1:9", model="m", version="v1")


CHANGE_EVERY_DEFAULT = r"""
import inspect, json, sys
from legato_pipelines.policy.config import PolicyConfig
from legato_pipelines.policy.load_spec import LoadSpec
from legato_pipelines.setting_fields import user_settings

sentinels = json.loads(sys.argv[1])
for model in (PolicyConfig, LoadSpec):
    for name, (field_name, field) in {
        **user_settings(model, "cli"), **user_settings(model, "dagster")
    }.items():
        field = model.model_fields[field_name]
        value = sentinels[name]
        if field.default_factory is not None:
            field.default_factory = lambda value=value: dict(value)
        else:
            field.default = value

from legato_pipelines.cli.collect import collect_command  # noqa: E402
from legato_pipelines.resources.defaults import default_resources  # noqa: E402
from legato_pipelines.resources.policy import PolicyResource  # noqa: E402

params = inspect.signature(collect_command).parameters
resource = default_resources()["policy"]
print(json.dumps({
    "cli": {n: params[n].default for n in sentinels if n in params},
    "dagster": {
        n: PolicyResource.model_fields[n].get_default(call_default_factory=True)
        for n in sentinels if n in PolicyResource.model_fields
    },
    "env": {n: getattr(resource, n) for n in sentinels if n in PolicyResource.model_fields},
}))
"""

SENTINELS = {
    "version": "v-sentinel",
    "temperature": 0.25,
    "top_p": 0.5,
    "max_tokens": 4321,
    "sampling_seed": 4242,
    "logprobs_mode": "processed_logprobs",
    "extra_body": {"sentinel": 1},
    "load": "external",
    "load_server": "sglang",
    "load_keep": 7,
    "weights_route": "/sentinel_route",
    "weights_payload": {"path": "{version}"},
    "load_timeout": 77.5,
    "load_wait": 88.5,
}


def test_a_default_changed_on_the_model_changes_the_flag_the_field_and_the_environment():
    """The consumers are generated from the models when they are imported: a child process
    changes every declared default before importing them and reads the three kinds back."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEGATO_POLICY_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", CHANGE_EVERY_DEFAULT, json.dumps(SENTINELS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for name in CLI_NAMES:
        value = SENTINELS[name]
        assert seen["cli"][name] == (json.dumps(value) if isinstance(value, dict) else value), name
    for name in DAGSTER_NAMES:
        assert seen["dagster"][name] == SENTINELS[name], name
        assert seen["env"][name] == SENTINELS[name], name


CONSUMERS = [
    "legato_pipelines/cli/collect.py",
    "legato_pipelines/resources/policy.py",
    "legato_pipelines/resources/defaults.py",
    "legato_pipelines/assets/advice.py",
    "legato_pipelines/rollout/settings.py",
]


def test_no_consumer_holds_a_copy_of_a_default():
    """The distinctive defaults (numbers of 3 digits or more, routes, JSON bodies) and the
    engine-only ones ``CollectSettings`` overrides (``step_timeout``) are written once: in
    their model, not in the modules that expose them."""
    literals: dict[str, str] = {}  # the text of a default -> a pattern finding it
    values = [*_declared("cli").values(), *_declared("dagster").values()]
    values.append(PolicyConfig.model_fields["step_timeout"].default)
    for value in values:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 60:
            for text in {repr(value), repr(int(value))}:
                literals[text] = rf"(?<![\w.]){re.escape(text)}(?![\w.])"
        elif isinstance(value, str) and value.startswith("/"):
            for text in (f'"{value}"', f"'{value}'"):
                literals[text] = re.escape(text)
        elif isinstance(value, dict) and value:
            text = json.dumps(value)[1:-1]
            literals[text] = re.escape(text)
    assert {"2048", "3600.0", "600.0", '"/update_weights"', "60.0"} <= set(literals)
    for path in CONSUMERS:
        text = (ROOT / path).read_text()
        found = sorted(lit for lit, pattern in literals.items() if re.search(pattern, text))
        assert not found, f"{path} repeats defaults {found}"
