"""Policy configuration: which OpenAI-compatible server, which model, which policy version.

The API key is not a field: it is read from ``LEGATO_POLICY_KEY`` only (:mod:`.key`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..setting_fields import setting
from ..versions import check_version_key
from .key import API_KEY_ENV, policy_api_key
from .wire import check_extra_body

__all__ = ["API_KEY_ENV", "PolicyConfig", "policy_api_key"]


class PolicyConfig(BaseModel):
    """Where and how to call the policy. The sampling fields are declared here once with
    :func:`~legato_pipelines.setting_fields.setting`: the ``legato collect`` flags of the same
    names (``--temperature``, ``--top-p``, ``--max-tokens``, ``--sampling-seed``,
    ``--logprobs-mode``, ``--version``) and the Dagster policy resource's fields are generated
    from them.

    Fields (units in brackets):
      base_url      the server root, e.g. ``http://127.0.0.1:8000`` or ``.../v1`` (both work);
                    no credentials, query string or fragment (a ``ValidationError`` that never
                    echoes the URL: the key goes in ``LEGATO_POLICY_KEY``)
      model         the served model name (``/v1/models`` id)
      version       the policy version every record is tied to (the Dagster partition key)
      temperature, top_p, max_tokens [tokens]   sampling; RL defaults sample the policy as is
                    (temperature 1, top_p 1) so logprobs are those of the behaviour policy
      sampling_seed the run's sampling seed (``None``: no ``seed`` sent, the server's own
                    randomness). Each request of a rollout step is sent its own ``seed``,
                    :meth:`request_seed` of this and the step's identity, never this value
                    itself: one seed for every request made every attempt of a group with
                    the same prompt sample the same tokens (issue 31)
      cache_salt    sent as every request's ``cache_salt`` (vLLM: requests share prefix-cache
                    blocks only with requests of the same salt); set by the engine from the
                    checkpoint's fingerprint when a load mode is given, so no request reuses
                    KV computed with other weights (``None``: not sent)
      logprobs_mode what the server's logprobs are (vLLM ``--logprobs-mode``: ``raw_logprobs``,
                    ``processed_logprobs``...), as you started it; recorded, not sent (the
                    server reports it on ``/v1/models`` only if it does, and that wins)
      extra_body    server-specific request fields (e.g. vLLM ``chat_template_kwargs``); checked
                    against the fields this client sets itself
      step_timeout  [s] hard deadline per HTTP request, enforced even if the server trickles
      retries       re-tries of a timed-out / 429 / 5xx / connection-failed call
      backoff       [s] base of the exponential backoff between re-tries (full jitter)
      request_token_ids  ask for ``return_token_ids`` (dropped for the batch on a 400)
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # a URL may hold a key

    base_url: str = Field(
        description="The policy server root, e.g. http://127.0.0.1:8000 (or .../v1); no "
        "credentials, query string or fragment."
    )
    model: str = Field(description="The served model name (its /v1/models id).")
    version: str = setting(
        "v0",
        description="Policy version every record is tied to (in Dagster: the partition key).",
        dagster=False,
    )
    temperature: float = setting(
        1.0, description="Sampling temperature (RL: 1.0, the behaviour policy as is).", ge=0
    )
    top_p: float = setting(1.0, description="Nucleus sampling top_p, in (0, 1].", gt=0, le=1)
    max_tokens: int = setting(
        2048, description="Completion tokens per step (the server's cap on one answer).", ge=1
    )
    sampling_seed: int | None = setting(
        None,
        description="The run's sampling seed; each request gets its own seed derived from it "
        "(unset: no seed sent).",
    )
    cache_salt: str | None = Field(
        None, description="Sent as every request's cache_salt (set by the engine on a load)."
    )
    logprobs_mode: str | None = setting(
        None,
        description="The server's logprobs mode as you started it (vLLM --logprobs-mode); "
        "recorded, not sent.",
    )
    extra_body: dict[str, Any] = setting(
        description="Server-specific request fields (e.g. vLLM chat_template_kwargs).",
        cli=False,
        default_factory=dict,
    )
    step_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds per model call: a hard deadline, even if the server trickles bytes.",
    )
    retries: int = Field(1, ge=0, description="Re-tries of a failed model call.")
    backoff: float = Field(
        0.5, ge=0, description="Seconds: base of the exponential backoff between re-tries."
    )
    request_token_ids: bool = Field(
        True, description="Ask for return_token_ids (dropped for the batch on a 400)."
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                "base_url must start with http:// or https:// (fix: --policy-url http://HOST:PORT)"
            )
        if "@" in value.split("//", 1)[1].split("/", 1)[0]:
            raise ValueError(
                "base_url must not carry credentials; put the key in LEGATO_POLICY_KEY"
            )
        if "?" in value or "#" in value:
            # request paths are appended to the URL (".../?key=.../v1/models"), and a query
            # string is where keys hide: refused, never echoed (hide_input_in_errors)
            raise ValueError(
                "base_url must not carry a query string or fragment ('?...' or '#...'); put "
                "the key in LEGATO_POLICY_KEY (fix: --policy-url http://HOST:PORT)"
            )
        return value

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_extra_body(value)
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        return check_version_key(value)  # the one rule for version keys (versions.py)

    def request_seed(
        self, task_id: str, group_id: str | None, attempt: int, step: int
    ) -> int | None:
        """The ``seed`` of one rollout step's request: the first 31 bits of
        ``sha256("<sampling_seed>:<task_id>:<group_id>:<attempt>:<step>")`` (0 <= seed <
        2**31, a range every server accepts), or ``None`` when ``sampling_seed`` is not set.
        Deterministic (a re-run or resume of the same attempt sends the same seeds), different
        for every attempt of a group and every step of an attempt. Not the execution: a
        desktop failure's re-execution replays the same seeds."""
        if self.sampling_seed is None:
            return None
        key = f"{self.sampling_seed}:{task_id}:{group_id}:{attempt}:{step}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") >> 1

    def sampling(self, logprobs_mode: str | None = None) -> dict[str, Any]:
        """The sampling settings a run is collected with (``run.json``'s ``sampling``, each
        sample's lineage): ``temperature``, ``top_p``, ``max_tokens`` [tokens],
        ``seed`` (the run's sampling seed, ``None``: not sent; each request is sent its own,
        :meth:`request_seed`, recorded on its step), ``seeds`` (``"per_step"`` when a seed is
        set: how the requests' seeds derive from it) and ``logprobs_mode`` (``logprobs_mode`` as the server
        reported it, else this config's, else ``None``: unknown)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.sampling_seed,
            **({"seeds": "per_step"} if self.sampling_seed is not None else {}),
            "logprobs_mode": logprobs_mode or self.logprobs_mode,
        }

    @property
    def output_limit(self) -> int:
        """[tokens] the most tokens one answer may have: ``extra_body.max_completion_tokens``
        when set (servers take it over ``max_tokens``), else ``max_tokens``."""
        limit = self.extra_body.get("max_completion_tokens")
        return limit if isinstance(limit, int) and limit > 0 else self.max_tokens

    @property
    def api_base(self) -> str:
        """The ``.../v1`` root requests go to."""
        return self.base_url if self.base_url.endswith("/v1") else self.base_url + "/v1"
