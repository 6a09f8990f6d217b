"""What a load is (:class:`LoadSpec`: the settings of one version's load) and what was decided
and proven for it (:class:`LoadPlan`, ``run.json``'s ``checkpoint`` entry). The flow that
fills a plan is :mod:`.loading`; the per-server requests are :mod:`.loaders`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError
from .servers import ServerState

LoadMode = Literal["none", "lora", "weights", "external"]
LOAD_MODES: tuple[str, ...] = ("none", "lora", "weights", "external")
ServerKind = Literal["auto", "vllm", "sglang"]


class LoadSpec(BaseModel):
    """How a policy version reaches the model server (module doc). Fields:

    mode            ``none`` | ``lora`` | ``weights`` | ``external`` (``--load``)
    checkpoint      the version's checkpoint folder (``--checkpoint``); needed by ``lora`` and
                    ``weights``, fingerprinted whenever given
    server          ``auto`` (SGLang when ``GET /get_model_info`` answers, else vLLM) |
                    ``vllm`` | ``sglang`` (``--load-server``)
    adapter         the adapter / served name of the version (default: the version)
    keep            [adapters] LoRA adapters from the same checkpoints directory kept loaded,
                    the new one included (``--load-keep``)
    weights_route   vLLM full-weights route (``--weights-route``)
    weights_payload its JSON body; strings ``{checkpoint}`` / ``{version}`` are filled in
                    (``--weights-payload``)
    timeout         [s] per load / unload request (loading weights takes minutes;
                    ``--load-timeout``)
    wait            [s] how long a ``weights`` run waits for another run of this host that
                    holds the server's weights (:mod:`.servers`; ``--load-wait``)
    """

    model_config = ConfigDict(extra="forbid")

    mode: LoadMode = "none"
    checkpoint: str | None = None
    server: ServerKind = "auto"
    adapter: str | None = None
    keep: int = Field(2, ge=1)
    weights_route: str = "/update_weights"
    weights_payload: dict[str, Any] = Field(default_factory=lambda: {"model_path": "{checkpoint}"})
    timeout: float = Field(600.0, gt=0)
    wait: float = Field(3600.0, ge=0)

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
        """The spec from keyword values; raises ``ConfigError`` naming the field and its flag."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "load"
            flag = _FLAGS.get(name, f"--{name.replace('_', '-')}")
            raise ConfigError(
                f"load.{name}: {first['msg']}, got {first.get('input')!r} (fix: {flag})"
            ) from None


_FLAGS = {
    "mode": "--load",
    "server": "--load-server",
    "keep": "--load-keep",
    "timeout": "--load-timeout",
    "wait": "--load-wait",
}


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
