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
LEGATO_POLICY_LOAD_TIMEOUT ``policy.load_timeout`` (s per load request)           600
LEGATO_POLICY_LOAD_WAIT    ``policy.load_wait`` (s for the server's weights lock) 3600
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
from pathlib import Path
from typing import Any, get_args

import dagster as dg

from ..desktops.registry import DEFAULT_BACKEND, names
from ..errors import ConfigError
from ..policy.config import API_KEY_ENV
from ..policy.loading import LoadSpec
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


def _env_float(name: str, default: float, *, zero_ok: bool = False) -> float:
    """The variable as a number of seconds, > 0 (>= 0 with ``zero_ok``; ``ConfigError``
    naming the variable otherwise), or ``default`` when unset."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = None
    if value is None or value < 0 or (value == 0 and not zero_ok) or value != value:
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(
            f"{name}={raw!r} is not a number of seconds {bound} (fix: set {name} to one, or "
            "unset it for the default)"
        )
    return value


_JSON_EXAMPLES = {
    "LEGATO_BACKEND_OPTIONS": '{"latency": {"act": 0.1}}',
    "LEGATO_POLICY_WEIGHTS_PAYLOAD": '{"model_path": "{checkpoint}"}',
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
    choices: tuple[str, ...] | None = None,
) -> str | None:
    """The variable's value if it is one of ``choices`` (default: the resource field's
    ``Literal`` choices), ``None`` when unset; raises ``ConfigError`` naming the variable and
    the valid values otherwise (instead of a pydantic error about the field that never
    mentions the variable)."""
    raw = os.environ.get(name)
    if not raw:
        return None
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


def _env_route(name: str, default: str) -> Any:
    """``EnvVar(name)`` when set, checked now as the loader checks it (a path on the server,
    ``/...``, not a URL); ``ConfigError`` naming the variable otherwise."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        LoadSpec.checked(weights_route=raw)
    except ConfigError as exc:
        raise ConfigError(
            str(exc).replace("(fix: --weights-route)", f"(fix: set {name})")
        ) from None
    return dg.EnvVar(name)


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
            load_keep=_env_int("LEGATO_POLICY_LOAD_KEEP", 2, minimum=1),
            weights_route=_env_route("LEGATO_POLICY_WEIGHTS_ROUTE", "/update_weights"),
            weights_payload=_env_json("LEGATO_POLICY_WEIGHTS_PAYLOAD")
            or {"model_path": "{checkpoint}"},
            load_timeout=_env_float("LEGATO_POLICY_LOAD_TIMEOUT", 600.0),
            load_wait=_env_float("LEGATO_POLICY_LOAD_WAIT", 3600.0, zero_ok=True),
            checkpoint_root=_env("LEGATO_CHECKPOINTS", None),
        ),
        "desktops": DesktopPoolResource(
            backend=_env_choice("LEGATO_BACKEND", DesktopPoolResource, "backend", names())
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
