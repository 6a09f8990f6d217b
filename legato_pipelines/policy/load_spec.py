"""What a load is (:class:`LoadSpec`: the settings of one version's load) and what was decided
and proven for it (:class:`LoadPlan`, ``run.json``'s ``checkpoint`` entry). The flow that
fills a plan is :mod:`.loading`; the per-server requests are :mod:`.loaders`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError
from ..setting_fields import flag, setting
from .servers import ServerState

LoadMode = Literal["none", "lora", "weights", "external"]
LOAD_MODES: tuple[str, ...] = ("none", "lora", "weights", "external")
ServerKind = Literal["auto", "vllm", "sglang"]
"""``auto`` and the kinds of :data:`.loaders.LOADERS` (a test holds the two together)."""
_WEIGHTS_PAYLOAD = {"model_path": "{checkpoint}"}
WEIGHTS_PAYLOAD_EXAMPLE = json.dumps(_WEIGHTS_PAYLOAD)
"""The default body of the weights route, as text (for messages)."""


class LoadSpec(BaseModel):
    """How a policy version reaches the model server (:mod:`.loading`): the load settings.

    Each field is declared once here (default, bounds, unit, description) with the name users
    set it by (:func:`~legato_pipelines.setting_fields.setting`): the ``legato collect`` flags
    (``--load``, ``--load-server``, ``--load-keep``, ``--weights-route``, ``--weights-payload``,
    ``--load-timeout``, ``--load-wait``), the Dagster policy resource's fields of the same
    names and the ``LEGATO_POLICY_*`` variables are generated from them. ``checkpoint`` and
    ``adapter`` are per run: ``--checkpoint`` / ``--adapter``; in Dagster the run's
    ``legato/checkpoint`` tag (or ``LEGATO_CHECKPOINTS/<version>``) and the run config's
    ``adapter``.
    """

    model_config = ConfigDict(extra="forbid")

    mode: LoadMode = setting(
        "none",
        description="How the version reaches the server before any desktop starts: none | lora "
        "(an adapter, through the server's runtime LoRA API) | weights (full weights: SGLang's "
        "update_weights_from_disk, or weights_route on vLLM) | external (the trainer loads it; "
        "only verified).",
        name="load",
        env="LEGATO_POLICY_LOAD",
    )
    checkpoint: str | None = Field(
        None,
        description="The version's checkpoint folder; needed by lora and weights, "
        "fingerprinted whenever given.",
    )
    server: ServerKind = setting(
        "auto",
        description="Server kind to load into: auto (asks the server: SGLang when GET "
        "/get_model_info answers, else vLLM) | vllm | sglang.",
        name="load_server",
        env="LEGATO_POLICY_SERVER",
    )
    adapter: str | None = Field(
        None, description="The version's adapter / served name (default: the version)."
    )
    keep: int = setting(
        2,
        description="LoRA adapters of the same checkpoints directory kept loaded, the new one "
        "included.",
        name="load_keep",
        env="LEGATO_POLICY_LOAD_KEEP",
        rule="a whole number >= 1",
        ge=1,
    )
    weights_route: str = setting(
        "/update_weights",
        description="vLLM full-weights route of your server (vLLM has none of its own), e.g. "
        "prime-rl's; a path, not a URL.",
        env="LEGATO_POLICY_WEIGHTS_ROUTE",
        rule="a path on the policy server starting with '/', e.g. /update_weights (not a URL)",
    )
    weights_payload: dict[str, Any] = setting(
        description="JSON body of weights_route; the strings {checkpoint} and {version} are "
        "filled in.",
        env="LEGATO_POLICY_WEIGHTS_PAYLOAD",
        rule=f"a JSON object, e.g. '{WEIGHTS_PAYLOAD_EXAMPLE}'",
        default_factory=lambda: dict(_WEIGHTS_PAYLOAD),
    )
    timeout: float = setting(
        600.0,
        description="Seconds one load / unload request may take (loading weights takes minutes).",
        name="load_timeout",
        env="LEGATO_POLICY_LOAD_TIMEOUT",
        rule="a number of seconds > 0",
        gt=0,
    )
    wait: float = setting(
        3600.0,
        description="Seconds a weights run waits for another run of this host that holds the "
        "server's weights (or a lora run for the runs calling an adapter it must replace).",
        name="load_wait",
        env="LEGATO_POLICY_LOAD_WAIT",
        rule="a number of seconds >= 0",
        ge=0,
    )

    @field_validator("mode", "server", mode="before")
    @classmethod
    def _choice(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value  # LoRA is lora

    @field_validator("weights_payload", mode="before")
    @classmethod
    def _payload(cls, value: Any) -> Any:
        if isinstance(value, str):  # a flag's or a variable's text
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"must be a JSON object, e.g. '{WEIGHTS_PAYLOAD_EXAMPLE}' ({exc})"
                ) from None
        if not isinstance(value, dict):
            raise ValueError(f"must be a JSON object, e.g. '{WEIGHTS_PAYLOAD_EXAMPLE}'")
        return value

    @field_validator("weights_route")
    @classmethod
    def _route(cls, value: str) -> str:
        if "://" in value:
            raise ValueError(
                "must be a path on the policy server (e.g. /update_weights), not a URL: the "
                "server is the one --policy-url names"
            )
        if not value.startswith("/"):
            raise ValueError("must be a path starting with '/' (e.g. /update_weights)")
        return value

    @classmethod
    def checked(cls, **values: Any) -> LoadSpec:
        """The spec from keyword values (field names); raises ``ConfigError`` naming the field
        and its flag, e.g. ``load.keep: ..., got 0 (fix: --load-keep)``."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "load"
            fix = flag(cls, name) if name in cls.model_fields else "--load"
            raise ConfigError(
                f"load.{name}: {first['msg']}, got {first.get('input')!r} (fix: {fix})"
            ) from None


@dataclass
class LoadPlan:
    """What :func:`~.loading.plan_load` decided, before anything changes on the server: the mode, the
    server kind, the model id the batch will call (``model``), the checkpoint folder and its
    fingerprint."""

    spec: LoadSpec
    version: str
    server: str | None  # a kind of :data:`.loaders.LOADERS`; None for load none
    model: str
    base_model: str
    checkpoint: str | None
    fingerprint: dict[str, Any] | None
    root: str = ""
    proof: dict[str, Any] = field(default_factory=dict)
    state: ServerState | None = None
    held: list[Any] = field(default_factory=list)  # the weights lock and adapter leases
    lists_adapters: bool = True  # the server lists loaded adapters in /v1/models (its loader's)

    @property
    def adapter(self) -> str:
        """The adapter / served name of the version (``spec.adapter``, else the version)."""
        return self.spec.adapter or self.version

    @property
    def cache_salt(self) -> str | None:
        """The ``cache_salt`` every request of the batch carries: ``legato-`` and 32 hex digits
        of the checkpoint's fingerprint (``None`` without a checkpoint). vLLM keys an adapter's
        prefix cache by its name and path, not its weights: an adapter reloaded under the same
        name from a rewritten folder would be answered with KV computed by the old weights
        (issue 31: 1,664 of 1,743 prompt tokens). Requests share cached blocks only with
        requests of the same salt, so new weights never reuse the old ones' KV, and runs of
        the same weights still share theirs."""
        digest = (self.fingerprint or {}).get("digest")
        if not digest:
            return None
        return "legato-" + digest.removeprefix("sha256:")[:32]

    @property
    def listed_model(self) -> str:
        """The id ``/v1/models`` must list for the batch's calls to work: the called model,
        except a loaded adapter on a server that does not list adapters (SGLang calls it
        ``<base>:<adapter>`` and lists the base)."""
        if self.spec.mode == "lora" and not self.lists_adapters:
            return self.base_model
        return self.model

    def meta(self) -> dict[str, Any]:
        """``run.json``'s ``checkpoint`` entry: mode, server, served model, folder, fingerprint
        (digest and files), the ``cache_salt`` every request carries (derived from the
        fingerprint: the proof's other half, no request answered from cache of other weights)
        and the proof once :func:`~.loading.load_version` has run."""
        out: dict[str, Any] = {
            "load": self.spec.mode,
            "server": self.server,
            "served_model": self.model,
            "path": self.checkpoint,
            "fingerprint": (self.fingerprint or {}).get("digest"),
        }
        if self.cache_salt:
            out["cache_salt"] = self.cache_salt
        if self.fingerprint:
            out["files"] = self.fingerprint["files"]
        if self.proof:
            out["proof"] = self.proof
        return out
