"""The deployment's resources, configured once from the environment.

=========================  =====================================================  ==========
variable                   sets                                                   default
=========================  =====================================================  ==========
LEGATO_POLICY_URL          ``policy.base_url``                                    none: required
LEGATO_POLICY_MODEL        ``policy.model``                                       scripted-qwen
LEGATO_POLICY_KEY          ``policy.api_key`` (secret: ``EnvVar``, never shown)   none
LEGATO_POLICY_LOAD         ``policy.load`` (none | lora | weights | external)     none
LEGATO_POLICY_SERVER       ``policy.load_server`` (auto | vllm | sglang)          auto
LEGATO_POLICY_LOAD_KEEP    ``policy.load_keep`` (LoRA adapters kept loaded)       2
LEGATO_POLICY_WEIGHTS_ROUTE  ``policy.weights_route`` (vLLM full weights)         /update_weights
LEGATO_POLICY_WEIGHTS_PAYLOAD  ``policy.weights_payload`` (JSON object)           {"model_path": "{checkpoint}"}
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

String and integer settings that are set become ``EnvVar`` references (resolved when a run
starts, shown as the variable's name in the UI); unset ones take the default. The code
location loads without LEGATO_POLICY_URL (the UI, ``dg check defs``), but a run started without
it fails at once with an error naming the variable (``PolicyResource.api_base``): there is no
server a run could assume. The task list
(``LEGATO_TASKS``) is run config: see :class:`~legato_pipelines.assets.config.CollectConfig`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, get_args

import dagster as dg

from ..errors import ConfigError
from ..policy.config import API_KEY_ENV
from .checkpoints import CheckpointSourceResource
from .desktops import DesktopPoolResource
from .lake import LakeResource
from .policy import PolicyResource

DEFAULT_POLICY_MODEL = "scripted-qwen"


def _env(name: str, default: Any) -> Any:
    """``EnvVar(name)`` when the variable is set, else ``default``."""
    return dg.EnvVar(name) if os.environ.get(name) else default


def _env_int(name: str, default: int) -> Any:
    return dg.EnvVar.int(name) if os.environ.get(name) else default


def _env_json(name: str) -> dict[str, Any]:
    raw = os.environ.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name} must be a JSON object ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f'{name} must be a JSON object, e.g. \'{{"latency": {{"act": 0.1}}}}\'')
    return value


def _env_choice(name: str, resource: type[dg.ConfigurableResource], field: str) -> str | None:
    """The variable's value if it is one of the resource field's ``Literal`` choices, ``None``
    when unset; raises ``ConfigError`` naming the variable and the valid values otherwise
    (instead of a pydantic error about the field that never mentions the variable)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    choices = get_args(resource.model_fields[field].annotation)
    if raw not in choices:
        raise ConfigError(
            f"{name}={raw!r} is not a valid {field} (fix: set {name} to one of "
            f"{', '.join(choices)}, or unset it for the default)"
        )
    return raw


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """``policy``, ``desktops``, ``lake`` and ``checkpoints`` from the environment (table above)."""
    return {
        "policy": PolicyResource(
            base_url=_env("LEGATO_POLICY_URL", None),
            model=_env("LEGATO_POLICY_MODEL", DEFAULT_POLICY_MODEL),
            api_key=dg.EnvVar(API_KEY_ENV) if os.environ.get(API_KEY_ENV) else None,
            load=_env_choice("LEGATO_POLICY_LOAD", PolicyResource, "load") or "none",
            load_server=_env_choice("LEGATO_POLICY_SERVER", PolicyResource, "load_server")
            or "auto",
            load_keep=_env_int("LEGATO_POLICY_LOAD_KEEP", 2),
            weights_route=_env("LEGATO_POLICY_WEIGHTS_ROUTE", "/update_weights"),
            weights_payload=_env_json("LEGATO_POLICY_WEIGHTS_PAYLOAD")
            or {"model_path": "{checkpoint}"},
            checkpoint_root=_env("LEGATO_CHECKPOINTS", None),
        ),
        "desktops": DesktopPoolResource(
            backend=_env_choice("LEGATO_BACKEND", DesktopPoolResource, "backend") or "fake",
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
