"""The OpenAI-compatible chat wire format, as vLLM, SGLang and hosted APIs actually speak it.

Three jobs, all pure functions (no I/O), so the client and ``probe`` share them:

* **Request bodies** (:func:`encode_body`): the JSON is built once with orjson while images are
  still ``legato-image://<sha>`` references, then each reference is replaced byte-for-byte by
  the screenshot's cached ``data:image/png;base64,...`` URL. No image is re-encoded per request.
* **Responses** (:func:`normalize`): vLLM (top-level ``prompt_token_ids``, per-choice
  ``token_ids``), SGLang (per-choice ids or ``sglext.output_ids``), older vLLM
  (``return_tokens_as_token_ids`` -> logprob tokens ``"token_id:N"``) and hosted OpenAI (no ids)
  become one :class:`~legato_pipelines.policy.response.PolicyResponse`.
* **Errors** (:func:`error_text`, :func:`image_limit`, :func:`redact`): both error envelopes
  (nested ``{"error": {"message": ...}}`` since vLLM 0.10.1 / OpenAI; flat
  ``{"object": "error", "message": ...}`` in older vLLM and SGLang), vLLM's image-limit message,
  and removal of the API key from anything quoted.

Facts per server: ``docs/wire-formats.md``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from ..errors import ConfigError
from ..images import IMAGE_REF_PREFIX
from .key import key_forms
from .response import PolicyResponse

# Fields the client sets itself; extra_body must not override them (use the PolicyConfig field).
CLIENT_FIELDS: dict[str, str] = {
    "model": "PolicyConfig.model",
    "messages": "the engine",
    "temperature": "PolicyConfig.temperature",
    "top_p": "PolicyConfig.top_p",
    "max_tokens": "PolicyConfig.max_tokens",
    "seed": "PolicyConfig.sampling_seed (each request gets its own seed derived from it)",
    "cache_salt": "the load mode (derived from the checkpoint's fingerprint)",
    "logprobs": "the client (always on: RL needs the behaviour policy's logprobs)",
    "top_logprobs": "the client (0: a null top_logprobs yields no logprobs on vLLM)",
    "return_token_ids": "PolicyConfig.request_token_ids",
    "stream": "the client (non-streaming only: SGLang rejects return_token_ids with stream)",
    "n": "the client (one completion per step)",
}

# Request fields the client may add to get token ids; a 400 naming one drops it for the batch.
TOKEN_ID_FIELDS: tuple[str, ...] = (
    "return_token_ids",  # vLLM >= 0.10.2 (PR #22587), SGLang PR #30917
    "return_tokens_as_token_ids",  # older vLLM: logprob tokens become "token_id:N"
    "return_output_ids",  # SGLang PR #34488: sglext.output_ids
)

# Vendor extension fields of vLLM / SGLang / OpenAI chat requests that users put in extra_body.
# vLLM and SGLang ignore unknown fields silently, so a near-miss of one of these is a typo.
KNOWN_EXTRA_FIELDS: frozenset[str] = frozenset(
    {
        # OpenAI
        "frequency_penalty", "presence_penalty", "logit_bias", "max_completion_tokens", "seed",
        "stop", "response_format", "tools", "tool_choice", "parallel_tool_calls", "user",
        "metadata", "store", "service_tier", "reasoning_effort", "prompt_cache_key",
        "stream_options", "modalities", "prediction", "safety_identifier", "verbosity",
        # vLLM
        "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs",
        "allowed_token_ids", "bad_words", "echo", "add_generation_prompt",
        "continue_final_message", "add_special_tokens", "documents", "chat_template",
        "chat_template_kwargs", "mm_processor_kwargs", "structured_outputs", "guided_json",
        "guided_regex", "guided_choice", "guided_grammar", "priority", "request_id",
        "return_tokens_as_token_ids", "logprob_token_ids", "return_prompt_text",
        "include_reasoning", "vllm_xargs", "kv_transfer_params",
        # SGLang
        "separate_reasoning", "stream_reasoning", "return_hidden_states", "return_input_ids",
        "return_output_ids", "return_prompt_token_ids", "return_cached_tokens_details", "rid",
        "lora_path", "regex", "ebnf", "json_schema", "no_stop_trim", "custom_logit_processor",
        "custom_params", "input_ids", "session_params",
    }
)  # fmt: skip

_IMAGE_LIMIT_RE = re.compile(r"At most (\d+) image\(s\) may be provided in one (?:prompt|request)")
_IMAGE_REF_RE = re.compile(rb'"url":"' + re.escape(IMAGE_REF_PREFIX.encode()) + rb'([0-9a-f]{64})"')
_CONTEXT_LENGTH_RE = re.compile(
    r"maximum context length|context length|max_model_len|maximum model length"
    r"|context_length_exceeded|longer than the model's context",
    re.IGNORECASE,
)
_TOKEN_ID_STRING = "token_id:"
SENTINEL_LOGPROB = -9999.0
"""vLLM's clamp for a ``-inf`` logprob (a token the sampler could not have drawn): any logprob
at or below it, or not finite, is a sentinel, never a real logprob (docs/wire-formats.md §1)."""
REDACTED = "[redacted]"
_MAX_QUOTE = 1000  # characters of a server message kept in an exception


def check_extra_body(extra_body: Mapping[str, Any]) -> None:
    """Reject ``extra_body`` fields that would fight the client or are likely typos.

    Raises :class:`ConfigError` naming the field and the fix when a field is one the client
    sets itself (:data:`CLIENT_FIELDS`), or is not a known vendor field but is a near-miss of
    one (``return_token_id`` for ``return_tokens_as_token_ids``...): vLLM and SGLang accept
    unknown fields and ignore them without a word (docs/wire-formats.md §1, §2), so the client
    checks.
    Unknown fields that resemble nothing known pass (servers add fields faster than we do).
    """
    for key in extra_body:
        if key in CLIENT_FIELDS:
            raise ConfigError(
                f"extra_body.{key}: the client sets this field itself; use {CLIENT_FIELDS[key]}"
            )
        if key in KNOWN_EXTRA_FIELDS:
            continue
        close = difflib.get_close_matches(
            key, [*KNOWN_EXTRA_FIELDS, *CLIENT_FIELDS], n=1, cutoff=0.85
        )
        if close:
            raise ConfigError(
                f"extra_body.{key}: unknown field, did you mean {close[0]!r}? vLLM and SGLang "
                "ignore unknown fields silently, so a typo would do nothing"
            )


def encode_body(fields: Mapping[str, Any], images: Mapping[str, Any] | None = None) -> bytes:
    """The request body as JSON bytes, with every image reference replaced by its data URL.

    ``fields`` is the request object; image parts inside ``fields["messages"]`` look like
    ``{"type": "image_url", "image_url": {"url": "legato-image://<sha>"}}``. ``images`` maps
    ``sha`` -> :class:`~legato_pipelines.images.Screenshot` (anything with a ``data_url`` bytes
    attribute). The JSON is serialized once (orjson, compact: ``"url":"..."`` with no space) and
    each reference is spliced with the cached data URL bytes, which need no JSON escaping
    (base64 alphabet). A reference inside text is escaped by JSON (``\\"url\\"``) and never
    matches. Messages whose images are already data URLs pass through unchanged.

    Raises ``ValueError`` naming the sha when a reference has no entry in ``images``.
    """
    raw = orjson.dumps(fields)
    if not images and IMAGE_REF_PREFIX.encode() not in raw:
        return raw
    parts: list[bytes] = []
    pos = 0
    for match in _IMAGE_REF_RE.finditer(raw):
        sha = match.group(1).decode()
        shot = images.get(sha) if images else None
        if shot is None:
            raise ValueError(
                f"message refers to image legato-image://{sha} but it is not in images"
            )
        parts.append(raw[pos : match.start()])
        parts.append(b'"url":"')
        parts.append(shot.data_url)
        parts.append(b'"')
        pos = match.end()
    if not parts:
        return raw
    parts.append(raw[pos:])
    return b"".join(parts)


def redact(text: str, secret: str | None = None) -> str:
    """``text`` with the policy API key (``LEGATO_POLICY_KEY``, or ``secret``) replaced, also
    where it is quoted escaped (``repr``: a newline as ``\\n``) or with its whitespace.

    Servers quote what they were sent (OpenAI's 401 names the key it got); everything the
    client raises or logs from a server's words goes through here.
    """
    forms = [secret, repr(secret)[1:-1]] if secret is not None else key_forms()
    for form in forms:
        if form and form in text:
            text = text.replace(form, REDACTED)
    return text


def error_text(body: bytes | str) -> str:
    """The server's own error message from an error response body, redacted, at most 1000 chars.

    Understands the nested envelope ``{"error": {"message", "type", "param", "code"}}`` (vLLM
    >= 0.10.1, OpenAI), the flat one ``{"object": "error", "message", ...}`` (older vLLM,
    SGLang), ``{"error": "Unauthorized"}`` (vLLM's API-key middleware), FastAPI's
    ``{"detail": ...}`` and plain text.
    """
    if isinstance(body, bytes):
        try:
            data: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = body.decode("utf-8", errors="replace")
    else:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = body
    message: Any = data
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            message = err.get("message") or err
        elif isinstance(err, str):
            message = err
        elif "message" in data:
            message = data["message"]
        elif "detail" in data:
            message = data["detail"]
    if not isinstance(message, str):
        message = orjson.dumps(message).decode()
    message = message.strip() or "(empty body)"
    if len(message) > _MAX_QUOTE:
        message = message[:_MAX_QUOTE] + "..."
    return redact(message)


def image_limit(message: str) -> int | None:
    """N from vLLM's "At most N image(s) may be provided in one prompt/request", else ``None``."""
    match = _IMAGE_LIMIT_RE.search(message)
    return int(match.group(1)) if match else None


def context_length(message: str) -> bool:
    """Whether a 400 message says the prompt (plus ``max_tokens``) exceeds the model's context:
    vLLM "This model's maximum context length is N tokens" / "... is longer than the maximum
    model length", SGLang "... exceeds the model's maximum context length" / "longer than the
    model's context length", OpenAI ``context_length_exceeded``."""
    return bool(_CONTEXT_LENGTH_RE.search(message))


def clean_logprobs(values: list[Any]) -> tuple[list[float | None], int]:
    """(logprobs, sentinels): each logprob as a float, with every sentinel (``<= -9999``, NaN,
    +-inf, missing, not a number) replaced by ``None`` so it can never pass for a real logprob,
    and how many were replaced."""
    out: list[float | None] = []
    bad = 0
    for value in values:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if math.isfinite(number) and number > SENTINEL_LOGPROB:
            out.append(number)
        else:
            out.append(None)
            bad += 1
    return out, bad


def refused_field(message: str, candidates: tuple[str, ...] | list[str]) -> str | None:
    """Which of ``candidates`` a 400 message names (OpenAI: "Unrecognized request argument
    supplied: return_token_ids"; pydantic servers: "Extra inputs are not permitted" with the
    field in ``loc``), else ``None``."""
    for name in candidates:
        if re.search(rf"(?<![A-Za-z_]){re.escape(name)}(?![A-Za-z_])", message):
            return name
    return None


def _ids(value: Any) -> list[int] | None:
    """A list of ints, or the first list of a per-choice list of lists, else ``None``."""
    if not isinstance(value, list):
        return None
    if value and isinstance(value[0], list):
        value = value[0]
    return value


def normalize(
    payload: Mapping[str, Any], *, asked_ids: bool, asked_logprobs: bool = True
) -> PolicyResponse:
    """One :class:`PolicyResponse` from a chat completion body (first choice).

    ``asked_ids``: the request asked for token ids, so none coming back is a fact
    (``token_ids_ignored``: the server silently ignored the field, docs/wire-formats.md §1), not an
    empty list. Token ids are taken from, in order: ``choices[0].token_ids`` (vLLM, SGLang),
    ``sglext.output_ids`` (SGLang), logprob tokens ``"token_id:N"`` (older vLLM's
    ``return_tokens_as_token_ids``). ``tokens`` (strings) are kept only when there are no ids.
    A missing ``usage.prompt_tokens_details.cached_tokens`` stays ``None`` (vLLM and SGLang omit
    it when 0 and when reporting is off). When ids are present, ``len(token_ids) ==
    len(logprobs) == completion_tokens`` is checked and a mismatch is noted (vLLM #28246).
    Sentinel logprobs (vLLM's ``-9999.0`` for ``-inf``, non-finite values) become ``None`` and
    are noted ``logprob_sentinels: N`` (:func:`clean_logprobs`).

    ``seconds``/``attempts``/``timeouts`` are left for the caller. Raises ``ValueError`` when
    the body has no choices.
    """
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("the server's answer has no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    notes: list[str] = []

    reasoning_field = None
    reasoning = None
    for key in ("reasoning", "reasoning_content"):
        if key in message:
            if reasoning_field is None or (reasoning is None and message[key] is not None):
                reasoning_field = key
                reasoning = message[key]

    logprobs: list[float] | None = None
    token_strings: list[str] | None = None
    lp = choice.get("logprobs")
    content_lp = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content_lp, list):
        logprobs, sentinels = clean_logprobs([entry.get("logprob") for entry in content_lp])
        token_strings = [entry.get("token") for entry in content_lp]
        if sentinels:
            notes.append(f"logprob_sentinels: {sentinels}")
    elif asked_logprobs:
        notes.append("logprobs_missing")

    token_ids = _ids(choice.get("token_ids"))
    source = "choice.token_ids" if token_ids is not None else None
    sglext = payload.get("sglext") if isinstance(payload.get("sglext"), dict) else {}
    if token_ids is None and sglext.get("output_ids") is not None:
        token_ids = _ids(sglext["output_ids"])
        source = "sglext.output_ids" if token_ids is not None else None
    if (
        token_ids is None
        and token_strings
        and all(isinstance(t, str) and t.startswith(_TOKEN_ID_STRING) for t in token_strings)
    ):
        try:
            token_ids = [int(t[len(_TOKEN_ID_STRING) :]) for t in token_strings]
            source = "logprobs.token_id_strings"
        except ValueError:
            token_ids = None
    if token_ids is None and asked_ids:
        notes.append("token_ids_ignored")

    prompt_ids = _ids(payload.get("prompt_token_ids"))
    if prompt_ids is None:
        prompt_ids = _ids(choice.get("prompt_token_ids"))
    if prompt_ids is None:
        prompt_ids = _ids(sglext.get("input_ids"))

    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    completion_tokens = usage.get("completion_tokens")

    if token_ids is not None:
        lengths = {"token_ids": len(token_ids)}
        if logprobs is not None:
            lengths["logprobs"] = len(logprobs)
        if completion_tokens is not None:
            lengths["completion_tokens"] = completion_tokens
        if len(set(lengths.values())) > 1:
            notes.append("length_mismatch: " + " ".join(f"{k}={v}" for k, v in lengths.items()))

    calls = message.get("tool_calls")
    fingerprint = payload.get("system_fingerprint")  # a fact; no proof of weights (§5)
    return PolicyResponse(
        content=message.get("content"),
        reasoning=reasoning,
        tool_calls=[c for c in calls if isinstance(c, dict)] or None
        if isinstance(calls, list)
        else None,
        token_ids=token_ids,
        logprobs=logprobs,
        tokens=token_strings if token_ids is None else None,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=completion_tokens,
        cached_tokens=cached,
        token_ids_source=source,
        prompt_token_ids=prompt_ids,
        reasoning_field=reasoning_field,
        notes=notes,
        system_fingerprint=fingerprint if isinstance(fingerprint, str) else None,
    )
