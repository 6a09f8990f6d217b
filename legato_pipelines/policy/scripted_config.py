"""What the scripted policy server (:mod:`.scripted`) is set up with and what it logs: the
wire-format flavors, injectable :class:`Faults`, added :class:`Latency`, the script
(:func:`load_script`) and the :class:`RequestLog` of each request.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

NOT_A_MODEL = "legato scripted policy server: NOT a model (scripted responses, synthetic tokens)"
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM registers its runtime LoRA routes only when this variable is true ("1"/"true")."""
FLAVORS = ("vllm", "vllm-old", "sglang", "openai")

# Request fields hosted OpenAI accepts on chat completions (anything else: 400).
OPENAI_FIELDS = frozenset(
    {
        "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
        "max_tokens", "max_completion_tokens", "n", "presence_penalty", "response_format",
        "seed", "stop", "stream", "stream_options", "temperature", "top_p", "tools",
        "tool_choice", "parallel_tool_calls", "user", "metadata", "store", "service_tier",
        "reasoning_effort", "modalities", "audio", "prediction", "prompt_cache_key",
        "safety_identifier", "verbosity", "web_search_options", "functions", "function_call",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Flavor:
    nested_errors: bool
    reasoning_key: str | None
    ids: Literal["top", "choice", None]  # where return_token_ids puts prompt ids
    token_id_strings: bool  # honours return_tokens_as_token_ids
    sglext: bool  # honours return_output_ids / return_input_ids
    strict_fields: bool
    cached_always: bool
    image_limit_scope: str  # "prompt" (vLLM >= 0.9) or "request" (older chat_utils tracker)


FLAVOR_FORMATS: dict[str, Flavor] = {
    "vllm": Flavor(True, "reasoning", "top", True, False, False, False, "prompt"),
    "vllm-old": Flavor(False, "reasoning_content", None, True, False, False, False, "request"),
    "sglang": Flavor(False, "reasoning_content", "choice", False, True, False, False, "prompt"),
    "openai": Flavor(True, None, None, False, False, True, True, "prompt"),
}


@dataclass
class Faults:
    """Faults to inject (all off by default). Counts are over chat requests, 1-based.

    hang_every      every Nth request hangs: ``sleep`` (no bytes, until the client gives up
                    or ``hang_seconds`` pass) or ``trickle`` (headers at once, then one byte
                    every ``trickle_interval`` seconds for ``hang_seconds``, then the answer)
    error_every     every Nth request answers ``error_status`` (default 500)
    error_rate      fraction of requests answering ``error_status`` (seeded by ``seed``)
    reject_unknown_fields  400 "Unrecognized request argument supplied: X" for fields hosted
                    OpenAI does not know (always on for the ``openai`` flavor)
    image_limit     more images than this in one request -> vLLM's 400 "At most N image(s)"
    no_logprobs     never return logprobs (a server unusable for RL)
    token_ids_null  return ``token_ids: null`` although asked (vLLM #28246)
    completion_tokens_offset  add this to ``usage.completion_tokens`` (length mismatch)
    sentinel_every  every Nth request's first logprob is ``-9999.0`` (vLLM's clamp of -inf)
    mismatch_every  every Nth request has ``extra_logprobs`` more logprob entries than token
                    ids (reasoning tokens counted in logprobs, not in ids)
    abort_every     every Nth request answers HTTP 200 with ``finish_reason: "abort"`` and the
                    first ``abort_tokens`` tokens of its text (a half tool call)
    empty_every     every Nth request answers HTTP 200 with no text and no tokens
    max_model_len   [tokens] prompt + max_tokens above it -> a 400 in the server's words
                    ("This model's maximum context length is N tokens..." for vLLM)
    shorten_to_context  with ``max_model_len``: what vLLM 0.32 does instead of that 400 when
                    the prompt itself fits: the output is cut at the context (HTTP 200,
                    ``finish_reason: length``, fewer tokens than ``max_tokens``)
    reject_text     a request whose body holds this text (e.g. in an earlier answer of the
                    attempt) -> a 400 about that prompt, as vLLM answers when its chat
                    template or multimodal processor refuses one request's content
    """

    hang_every: int = 0
    hang_mode: Literal["sleep", "trickle"] = "sleep"
    hang_seconds: float = 300.0
    trickle_interval: float = 0.1
    error_every: int = 0
    error_rate: float = 0.0
    error_status: int = 500
    reject_unknown_fields: bool = False
    image_limit: int | None = None
    no_logprobs: bool = False
    token_ids_null: bool = False
    completion_tokens_offset: int = 0
    sentinel_every: int = 0
    mismatch_every: int = 0
    extra_logprobs: int = 11
    abort_every: int = 0
    abort_tokens: int = 5
    empty_every: int = 0
    max_model_len: int | None = None
    shorten_to_context: bool = False
    reject_text: str | None = None
    cache_report: bool = True
    seed: int = 0


@dataclass
class Latency:
    """Added latency per answered request [s]: ``median`` fixed, or lognormal around it with
    ``sigma`` (log-space standard deviation), seeded."""

    median: float = 0.0
    sigma: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.median < 0 or self.sigma < 0:
            raise ValueError(
                "latency median and sigma must be >= 0 (fix: --latency-median/--latency-sigma)"
            )
        self._rng = random.Random(self.seed)

    def sample(self) -> float:
        if self.median <= 0:
            return 0.0
        if self.sigma <= 0:
            return self.median
        return self.median * math.exp(self._rng.gauss(0.0, self.sigma))


@dataclass
class RequestLog:
    """One request as the server saw it (never the Authorization header itself).

    ``authorized``: the request carried ``Bearer <api_key>`` (``None`` when the server needs
    no key); ``fields``: top-level request fields; ``body``: raw bytes when ``record_bodies``.
    """

    seq: int
    path: str
    status: int = 200
    fields: tuple[str, ...] = ()
    n_images: int = 0
    authorized: bool | None = None
    bearer: bool = False
    fault: str | None = None
    step: int | None = None
    cached_tokens: int | None = None
    stale_cached_tokens: int = 0  # cached tokens computed by other weights than these
    seed: int | None = None  # the request's seed
    cache_salt: str | None = None  # the request's cache_salt
    body: bytes | None = None
    served: str | None = None  # the weights that answered (adapter name or weights folder name)
    at: float = field(default_factory=time.time)


def load_script(script: None | str | Path | dict) -> dict[str, Any]:
    """A script dict from ``None``, a dict or a JSON file path; checked.

    Raises ``ValueError`` naming the field when the shape is wrong.
    """
    if script is None:
        return {"tasks": {}, "default": None}
    if isinstance(script, (str, Path)):
        data = orjson.loads(Path(script).read_bytes())
    else:
        data = script
    if not isinstance(data, dict):
        raise ValueError("script must be a JSON object with 'tasks' and/or 'default'")
    unknown = set(data) - {"tasks", "default"}
    if unknown:
        raise ValueError(f"script: unknown keys {sorted(unknown)} (expected 'tasks', 'default')")
    tasks = data.get("tasks") or {}
    if not isinstance(tasks, dict):
        raise ValueError("script.tasks must map instruction text to a list of responses")
    named = [(f"script.tasks[{k!r}]", v) for k, v in tasks.items()]
    if data.get("default") is not None:
        named.append(("script.default", data["default"]))
    for name, steps in named:
        if not isinstance(steps, list) or not steps:
            raise ValueError(f"{name} must be a non-empty list of responses")
        for i, step in enumerate(steps):
            options = step.get("sample") if isinstance(step, dict) and "sample" in step else [step]
            if not isinstance(options, list) or not options:
                raise ValueError(f"{name}[{i}].sample must be a non-empty list of responses")
            for option in options:
                if not isinstance(option, (str, dict)) or (
                    isinstance(option, dict) and not isinstance(option.get("content", ""), str)
                ):
                    raise ValueError(
                        f"{name}[{i}] must be a string, {{'content', 'reasoning'}} or "
                        "{'sample': [...]}"
                    )
    return {"tasks": dict(tasks), "default": data.get("default")}


class Reject(Exception):
    def __init__(
        self, status: int, message: str, *, kind: str = "BadRequestError", param: str | None = None
    ):
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
