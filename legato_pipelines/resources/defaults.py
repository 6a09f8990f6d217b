"""The deployment's resources, configured once from the environment.

=========================  =====================================================  ==========
variable                   sets                                                   default
=========================  =====================================================  ==========
LEGATO_POLICY_URL          ``policy.base_url``                                    none: required
LEGATO_POLICY_MODEL        ``policy.model``                                       scripted-qwen
LEGATO_POLICY_KEY          ``policy.api_key`` (secret: ``EnvVar``, never shown)   none
LEGATO_POLICY_LOAD         ``policy.load`` (none | lora | weights | external)     LoadSpec's
LEGATO_POLICY_SERVER       ``policy.load_server`` (auto | vllm | sglang)          LoadSpec's
LEGATO_POLICY_LOAD_KEEP    ``policy.load_keep`` (LoRA adapters kept loaded)       LoadSpec's
LEGATO_POLICY_WEIGHTS_ROUTE  ``policy.weights_route`` (vLLM full weights)         LoadSpec's
LEGATO_POLICY_WEIGHTS_PAYLOAD  ``policy.weights_payload`` (JSON object)           LoadSpec's
LEGATO_POLICY_LOAD_TIMEOUT ``policy.load_timeout`` (s per load request)           LoadSpec's
LEGATO_POLICY_LOAD_WAIT    ``policy.load_wait`` (s for the server's weights lock) LoadSpec's
LEGATO_BACKEND             ``desktops.backend``                                   fake
LEGATO_DESKTOPS            ``desktops.desktops``                                  4
LEGATO_DESKTOP_URLS        ``desktops.urls`` (space/comma-separated URLs)         none
LEGATO_BACKEND_OPTIONS     ``desktops.options`` (JSON object)                     {}
LEGATO_OSWORLD             ``desktops.osworld``                                   none
LEGATO_LAKE                ``lake.root``                                          ./lake
LEGATO_CHECKPOINTS         ``checkpoints.directory``, ``policy.checkpoint_root``  none
LEGATO_CHECKPOINT_SOURCE   ``checkpoints.source`` (directory | models)            directory
LEGATO_CHECKPOINT_GLOB     ``checkpoints.pattern``                                step-* / *
LEGATO_CHECKPOINT_READY    ``checkpoints.ready_marker``                           none
LEGATO_CHECKPOINT_STABLE_S ``checkpoints.stable_s`` (s; 0: count when complete)   30
=========================  =====================================================  ==========

The ``LEGATO_POLICY_*`` load variables are declared on the engine's
:class:`~legato_pipelines.policy.load_spec.LoadSpec` with the field they set (its default is
the default here: an unset variable passes nothing) and read by :func:`env_settings`.
String and integer settings that are set become ``EnvVar`` references (resolved when a run
starts, shown as the variable's name in the UI); unset ones take the default. Every value is
checked when the code location loads, so a bad one (``LEGATO_POLICY_SERVER=tgi``,
``LEGATO_POLICY_LOAD_KEEP=0`` or ``abc``, ``LEGATO_POLICY_WEIGHTS_ROUTE=update_weights``) fails
loading with a message naming the variable and its valid values, never later inside a run;
choices are case-insensitive (``LEGATO_POLICY_LOAD=LoRA`` is ``lora``). The code
location loads without LEGATO_POLICY_URL (the UI, ``dg check defs``), but a run started without
it fails at once with an error naming the variable (``PolicyResource.api_base``): there is no
server a run could assume. The task list
(``LEGATO_TASKS``) is run config: see :class:`~legato_pipelines.assets.config.CollectConfig`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import dagster as dg
from pydantic import BaseModel, ValidationError

from ..desktops.registry import DEFAULT_BACKEND, names
from ..errors import ConfigError
from ..policy.config import API_KEY_ENV, PolicyConfig
from ..policy.load_spec import LoadSpec
from ..setting_fields import env_fields, exposure, user_name
from .checkpoints import CheckpointSourceResource
from .desktops import DesktopPoolResource
from .lake import LakeResource
from .policy import PolicyResource

DEFAULT_POLICY_MODEL = "scripted-qwen"


def _env(name: str, default: Any) -> Any:
    """``EnvVar(name)`` when the variable is set, else ``default``."""
    return dg.EnvVar(name) if os.environ.get(name) else default


def _env_int(name: str, default: int, minimum: int = 0) -> Any:
    """``EnvVar.int(name)`` when set (checked now: an integer >= ``minimum``, else a
    ``ConfigError`` naming the variable), else ``default``."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigError(
            f"{name}={raw!r} is not a whole number >= {minimum} (fix: set {name} to one, or "
            "unset it for the default)"
        )
    return dg.EnvVar.int(name)


_JSON_EXAMPLES = {
    "LEGATO_BACKEND_OPTIONS": '{"latency": {"act": 0.1}}',
}


def _env_json(name: str) -> dict[str, Any]:
    raw = os.environ.get(name)
    if not raw:
        return {}
    example = _JSON_EXAMPLES.get(name, "{}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name} must be a JSON object, e.g. '{example}' ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object, e.g. '{example}'")
    return value


def _env_choice(
    name: str,
    resource: type[dg.ConfigurableResource],
    field: str,
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None,
) -> str | None:
    """The variable's value if it is one of ``choices`` (default: the resource field's
    ``Literal`` choices; a function: called only when the variable is set, as
    :func:`.desktops.registry.names`, which imports the plugins of
    ``LEGATO_BACKEND_MODULES``), ``None`` when unset; raises ``ConfigError`` naming the
    variable and the valid values otherwise (instead of a pydantic error about the field that
    never mentions the variable)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    if callable(choices):
        choices = choices()
    if choices is None:
        choices = get_args(resource.model_fields[field].annotation)
    folded = {c.lower(): c for c in choices}
    if raw.strip().lower() in folded:
        return folded[raw.strip().lower()]
    if raw not in choices:
        raise ConfigError(
            f"{name}={raw!r} is not a valid {field} (fix: set {name} to one of "
            f"{', '.join(choices)}, or unset it for the default)"
        )
    return raw


def env_settings(model: type[BaseModel]) -> dict[str, Any]:
    """The policy resource's fields that ``model``'s variables set
    (:func:`~legato_pipelines.setting_fields.env_fields`), for the variables that are set:
    each value checked now by ``model`` itself (its bounds and validators), else a
    ``ConfigError`` naming the variable, what a valid value is and the fix. Passed as
    ``EnvVar`` / ``EnvVar.int`` for a plain text / whole-number field the model takes as
    written, else as the checked value (a choice in any case, a number of seconds, a JSON
    object). Unset variables are left out: the field keeps the model's default."""
    out: dict[str, Any] = {}
    for variable, (field, info) in env_fields(model).items():
        raw = os.environ.get(variable)
        if not raw:
            continue
        name = user_name(model, field)
        try:
            checked = model.__pydantic_validator__.validate_assignment(
                model.model_construct(), field, raw
            )
        except ValidationError:
            choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
            if choices:
                raise ConfigError(
                    f"{variable}={raw!r} is not a valid {name} (fix: set {variable} to one of "
                    f"{', '.join(choices)}, or unset it for the default)"
                ) from None
            raise ConfigError(
                f"{variable}={raw!r} is not {exposure(info).get('rule') or 'valid'} (fix: set "
                f"{variable} to one, or unset it for the default)"
            ) from None
        value = getattr(checked, field)
        if info.annotation is int:
            out[name] = dg.EnvVar.int(variable)
        elif info.annotation is str and value == raw:
            out[name] = dg.EnvVar(variable)
        else:
            out[name] = value
    return out


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """``policy``, ``desktops``, ``lake`` and ``checkpoints`` from the environment (table above)."""
    return {
        "policy": PolicyResource(
            base_url=_env("LEGATO_POLICY_URL", None),
            model=_env("LEGATO_POLICY_MODEL", DEFAULT_POLICY_MODEL),
            api_key=dg.EnvVar(API_KEY_ENV) if os.environ.get(API_KEY_ENV) else None,
            checkpoint_root=_env("LEGATO_CHECKPOINTS", None),
            **env_settings(PolicyConfig),
            **env_settings(LoadSpec),
        ),
        "desktops": DesktopPoolResource(
            backend=_env_choice("LEGATO_BACKEND", DesktopPoolResource, "backend", names)
            or DEFAULT_BACKEND,
            desktops=_env_int("LEGATO_DESKTOPS", 4),
            options=_env_json("LEGATO_BACKEND_OPTIONS"),
            osworld=_env("LEGATO_OSWORLD", None),
            urls=os.environ.get("LEGATO_DESKTOP_URLS", "").replace(",", " ").split(),
        ),
        "lake": LakeResource(root=_env("LEGATO_LAKE", str(Path.cwd() / "lake"))),
        "checkpoints": CheckpointSourceResource(
            source=_env_choice("LEGATO_CHECKPOINT_SOURCE", CheckpointSourceResource, "source")
            or "directory",
            directory=_env("LEGATO_CHECKPOINTS", None),
            pattern=_env("LEGATO_CHECKPOINT_GLOB", None),
            ready_marker=_env("LEGATO_CHECKPOINT_READY", None),
            stable_s=_env_int("LEGATO_CHECKPOINT_STABLE_S", 30),
        ),
    }
