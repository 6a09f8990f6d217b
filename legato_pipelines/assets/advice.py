"""The engine's advice, translated for a Dagster run.

The engine's error messages name ``legato collect`` flags ("fix --policy-url", "pass --tasks
PATH"): right on the command line, no help in a Dagster run, where the same setting is an
environment variable, a resource field or a run config field. :func:`dagster_advice` appends
"(in Dagster: ...)" naming those; the engine's words stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from ..errors import ConfigError, LegatoError
from ..policy.config import PolicyConfig
from ..policy.load_spec import LoadSpec
from ..setting_fields import exposure, user_settings
from ..setting_fields import flag as flag_of
from .config import CollectConfig

RESOURCE_SETTINGS = {
    "--policy-url": "LEGATO_POLICY_URL / the policy resource's base_url",
    "--model": "LEGATO_POLICY_MODEL / the policy resource's model",
    "--tasks": "LEGATO_TASKS / the rollout_batch run config's tasks",
    "--osworld": "LEGATO_OSWORLD / the desktops resource's osworld",
    "--backend": "LEGATO_BACKEND / the desktops resource's backend",
    "--desktops": "LEGATO_DESKTOPS / the desktops resource's desktops",
    "--desktop-option": "LEGATO_BACKEND_OPTIONS / the desktops resource's options",
    "--osworld-python": 'LEGATO_BACKEND_OPTIONS {"osworld_python": PATH}',
    "--osworld-provider": 'LEGATO_BACKEND_OPTIONS {"provider": NAME}',
    "--checkpoint": "the run's legato/checkpoint tag (set by the checkpoint sensor) or "
    "LEGATO_CHECKPOINTS/<version>",
    "--adapter": "the rollout_batch run config's adapter (default: its model, else the "
    "partition key)",
    "--out": "the partition's run directory <lake>/runs/policy_version=<key>: another "
    "policy_version partition, or LEGATO_LAKE",
} | {
    flag_of(model, field): (f"{env} / " if (env := exposure(info).get("env")) else "")
    + f"the policy resource's {name}"
    for model in (PolicyConfig, LoadSpec)
    for name, (field, info) in user_settings(model, "dagster").items()
    if exposure(info)["cli"]
}
"""``legato collect`` flags that are resources (or the lake) in the code location; those of
the policy and load settings generated from their models (variable and resource field)."""

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")


def _setting(flag: str) -> str | None:
    if flag in RESOURCE_SETTINGS:
        return RESOURCE_SETTINGS[flag]
    field = flag[2:].replace("-", "_")
    if field.startswith("no_") and field[3:] in CollectConfig.model_fields:
        field = field[3:]  # --no-ready-signal, --no-fast-reset: the switch's field
    if field in CollectConfig.model_fields:
        return f"the rollout_batch run config's {field}"
    return None


IN_USE = "in use by another collection"
"""The engine's run directory lock (:meth:`legato_pipelines.store.rundir.RunWriter.open`)."""
IN_USE_ADVICE = (
    "another run of this policy_version partition is collecting into its run directory: wait "
    "for it to finish, or cancel it (Runs), then materialize the partition again"
)


def dagster_advice(message: str) -> str:
    """``message`` with "(in Dagster: <settings>)" appended for every ``legato collect`` flag it
    names (in order, once each); unchanged when it names none, or names only flags of other
    programs (e.g. a server's ``--limit-mm-per-prompt``). The run directory lock gets its own
    advice (a run directory is the partition's, not a flag)."""
    if IN_USE in message:
        return f"{message} (in Dagster: {IN_USE_ADVICE})"
    settings = []
    for flag in _FLAG.findall(message):
        setting = _setting(flag)
        if setting and setting not in settings:
            settings.append(setting)
    if not settings:
        return message
    return f"{message} (in Dagster: {'; '.join(settings)})"


@contextmanager
def in_dagster(what: str) -> Iterator[None]:
    """Re-raise a :class:`~legato_pipelines.errors.LegatoError` from the block as the same
    object (same class and attributes: a ``ConfigError`` stays one) with its message passed
    through :func:`dagster_advice`; a ``pydantic.ValidationError`` (e.g. from the engine's
    ``PolicyConfig``) becomes a ``ConfigError`` "<what>: <field>: <message>" the same way."""
    try:
        yield
    except LegatoError as exc:
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (dagster_advice(exc.args[0]), *exc.args[1:])
        raise
    except ValidationError as exc:
        parts = [
            f"{'.'.join(str(x) for x in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        ]
        raise ConfigError(dagster_advice(f"{what}: {'; '.join(parts)}")) from exc
