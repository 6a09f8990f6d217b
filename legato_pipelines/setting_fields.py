"""Where users set a field of an engine model: a ``legato`` flag, a Dagster resource field, an
environment variable.

A setting is declared once, on the engine's model, with :func:`setting`: its default, bounds,
unit and description (its help text everywhere), and the name users know it by. Everything
else is generated from that declaration: the ``legato collect`` flags
(:func:`~legato_pipelines.cli.options.model_options`), the fields of the Dagster policy
resource (:mod:`legato_pipelines.resources.policy`) and the environment variables read when
the code location loads (:mod:`legato_pipelines.resources.defaults`). Models declared this way:
:class:`~legato_pipelines.policy.config.PolicyConfig` (sampling) and
:class:`~legato_pipelines.policy.load_spec.LoadSpec` (loading a version into the server).

Free of typer and Dagster: it only reads pydantic field metadata (``json_schema_extra``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

Where = Literal["cli", "dagster"]


def setting(
    default: Any = PydanticUndefined,
    *,
    description: str,
    name: str | None = None,
    cli: bool = True,
    dagster: bool = True,
    env: str | None = None,
    rule: str | None = None,
    **kw: Any,
) -> Any:
    """A pydantic ``Field`` users can set. ``description``: one sentence with the unit (the
    flag's help, the Dagster field's description, the reference docs); ``name``: the name users
    know it by when it differs from the field's (``load_keep`` for ``LoadSpec.keep``): the flag
    is ``--`` and the name dashed (``--load-keep``), the Dagster resource field the name;
    ``cli`` / ``dagster``: whether it is a ``legato collect`` flag / a policy resource field;
    ``env``: the variable that sets it in a deployment; ``rule``: what a valid value is, in
    words ("a whole number >= 1"), for messages about the variable. ``**kw`` go to ``Field``
    (bounds, ``default_factory``)."""
    extra: dict[str, Any] = {"setting": name or "", "cli": cli, "dagster": dagster}
    if env:
        extra["env"] = env
    if rule:
        extra["rule"] = rule
    return Field(default, description=description, json_schema_extra=extra, **kw)


def unchecked(field: FieldInfo, description: str | None = None) -> FieldInfo:
    """``field`` without its bounds and validators (same default, description or
    ``description``, metadata), for a Dagster field whose value is checked later by the engine
    model, with a message naming the setting (Dagster's config schema, the launchpad's form,
    has no bounds, and an ``EnvVar.int`` placeholder would fail one before it is resolved)."""
    return Field(
        default=field.default,
        default_factory=field.default_factory,
        description=description or field.description,
        json_schema_extra=field.json_schema_extra,
    )


def exposure(field: FieldInfo) -> dict[str, Any]:
    """The :func:`setting` metadata of a field (empty when users cannot set it)."""
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) and "setting" in extra else {}


def user_name(model: type[BaseModel], field: str) -> str:
    """The name users know ``model``'s field by (the field's own name unless declared)."""
    return exposure(model.model_fields[field]).get("setting") or field


def flag(model: type[BaseModel], field: str) -> str:
    """The ``legato collect`` flag of ``model``'s field (``--load-keep`` for ``LoadSpec.keep``)."""
    return "--" + user_name(model, field).replace("_", "-")


def user_settings(model: type[BaseModel], where: Where) -> dict[str, tuple[str, FieldInfo]]:
    """The fields of ``model`` set ``where`` (``cli``: flags, ``dagster``: resource fields), in
    field order: ``{user name: (field name, field)}``."""
    out: dict[str, tuple[str, FieldInfo]] = {}
    for name, field in model.model_fields.items():
        meta = exposure(field)
        if meta.get(where):
            out[meta["setting"] or name] = (name, field)
    return out


def from_user(model: type[BaseModel], values: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """``values`` keyed by user name (the flags' parameters, a resource's fields) as keyword
    arguments of ``model`` (its field names); names ``values`` does not hold are left out."""
    return {
        field: values[name]
        for name, (field, _) in user_settings(model, where).items()
        if name in values
    }


def env_fields(model: type[BaseModel]) -> dict[str, tuple[str, FieldInfo]]:
    """``{variable: (field name, field)}`` of the fields of ``model`` an environment variable
    sets, in field order."""
    return {
        meta["env"]: (name, field)
        for name, field in model.model_fields.items()
        if (meta := exposure(field)).get("env")
    }
