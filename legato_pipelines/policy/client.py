"""The async policy client: the only way the product talks to a model.

Pooled keep-alive ``httpx.AsyncClient``s (created lazily inside the running event loop; one
per :data:`POOL_SHARD` in-flight slots, see there why), an optional global bound on requests
in flight (``max_inflight``), a hard deadline per HTTP request
(``step_timeout``, enforced with ``asyncio.timeout`` around the whole request *and* body read,
so a server that trickles bytes cannot hold a rollout), re-tries with exponential backoff and
full jitter for timeouts, connection errors, 429 and 5xx, and fail-fast configuration errors
for 400/401/403/404 quoting the server's own (redacted) words.

Token ids: every request asks for ``logprobs`` (``top_logprobs: 0``) and ``return_token_ids``.
A server that answers 400 naming ``return_token_ids`` (hosted OpenAI: "Unrecognized request
argument supplied") gets it dropped for the rest of the batch (this client's lifetime) while
logprobs stay on; every later record notes ``token_ids_dropped``. A server that ignores it
silently (vLLM < 0.10.2, SGLang before PR #30917) is detected because no ids come back
(``token_ids_ignored``); the client then also asks for ``return_tokens_as_token_ids`` (older
vLLM) and ``return_output_ids`` (SGLang ``sglext``) on later calls.

Per-request fields (issue 31): ``seed`` is the caller's per-step seed when it gives one
(:meth:`PolicyConfig.request_seed`), else ``sampling_seed``; ``cache_salt`` is sent on every
request when the config has one (a server that refuses it with a 400 gets it dropped like
``return_token_ids``, every later record noting ``cache_salt_dropped``). A 400 that is not
about a field, the context, the image limit or the key, once a request of this client has been
answered, is about what that request carries: :class:`PolicyRequestError`, for that attempt
only; before any answer it is a configuration error of the batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import time
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from ..errors import (
    ContextLengthError,
    ImageLimitError,
    PolicyConfigError,
    PolicyError,
    PolicyRequestError,
    PolicyTimeout,
)
from ..images import Screenshot
from .config import PolicyConfig
from .key import policy_api_key
from .response import PolicyResponse
from .wire import (
    CLIENT_FIELDS,
    TOKEN_ID_FIELDS,
    context_length,
    encode_body,
    error_text,
    image_limit,
    normalize,
    redact,
    refused_field,
)

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 425, 429})  # plus every 5xx
BACKOFF_CAP_S = 30.0  # [s] ceiling of one backoff sleep
_KEEPALIVE = 256  # pooled idle connections kept when max_inflight is unbounded
# Connections per pooled httpx client. httpcore 1.0.9 scans every pooled connection for every
# queued request on each request and release (O(connections x queued); encode/httpcore#1035,
# encode/httpx#3215): 64 in flight through one pool cost ~6 ms of CPU per call, 8 cost ~1.3 ms.
# So in-flight slots are dealt out in shards of this many, each shard with its own pool.
POOL_SHARD = 8


class _Retryable(Exception):
    """One failed attempt that may be re-tried (internal)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        timeout: bool = False,
        seconds: float = 0.0,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.timeout = timeout
        self.seconds = seconds


def _connect_reason(exc: BaseException) -> str:
    """The operating system's words for a failed connect (e.g. "Connection refused")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and (seen.errno or seen.strerror):
            return os.strerror(seen.errno) if seen.errno else str(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    return redact(str(exc)) or "connection failed"


def _server_failure(result: PolicyResponse) -> str | None:
    """Why an HTTP 200 answer is a failure of the server, not the model's output: the request
    was aborted (``finish_reason: "abort"``, vLLM / SGLang when the engine drops it) or the
    answer is empty (no text, no reasoning, no tool call, no tokens). ``None`` when it is a
    real answer."""
    if result.finish_reason == "abort":
        return 'an aborted answer (HTTP 200, finish_reason "abort")'
    if (
        not (result.content or "").strip()
        and not (result.reasoning or "").strip()
        and not result.tool_calls
        and not result.token_ids
        and not result.completion_tokens
    ):
        return "an empty answer (HTTP 200: no text, reasoning or tokens)"
    return None


class PolicyClient:
    """Async client of one OpenAI-compatible ``/v1/chat/completions`` server, for one batch.

    ``max_inflight``: at most this many HTTP requests at once across all callers (``None``:
    unbounded; the connection pool then grows as needed). Waiting for a slot does not count
    into ``step_timeout`` nor into a response's ``seconds``. Slots are grouped in shards of
    :data:`POOL_SHARD`, each served by its own pooled keep-alive ``httpx.AsyncClient`` with
    exactly that many connections, so a request never waits inside httpx's pool and the
    pool's per-request bookkeeping stays small (see :data:`POOL_SHARD`).

    Use as ``async with PolicyClient(config) as client:`` or call :meth:`aclose`.
    State kept for the batch: :attr:`token_ids_dropped` (the server refused
    ``return_token_ids`` with a 400) and :attr:`token_ids_ignored` (it accepted the field and
    returned no ids).
    """

    def __init__(self, config: PolicyConfig, *, max_inflight: int | None = None):
        if max_inflight is not None and max_inflight < 1:
            raise ValueError("max_inflight must be >= 1 or None (fix: --max-inflight N)")
        self.config = config
        self.max_inflight = max_inflight
        self.token_ids_dropped = False
        self.token_ids_ignored = False
        self.cache_salt_dropped = False
        self.answered = 0  # HTTP 200 answers so far: the settings work with this server
        n_shards = -(-max_inflight // POOL_SHARD) if max_inflight else 1
        self._http: list[httpx.AsyncClient | None] = [None] * n_shards
        self._ssl: ssl.SSLContext | None = None
        # Free in-flight slots, each naming its shard; LIFO keeps warm connections busy.
        self._slots: asyncio.LifoQueue[int] | None = None
        if max_inflight:
            self._slots = asyncio.LifoQueue()
            for slot in reversed(range(max_inflight)):
                self._slots.put_nowait(slot // POOL_SHARD)
        self._url = config.api_base + "/chat/completions"
        self._fields: dict[str, Any] = {
            "model": config.model,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_tokens": config.max_tokens,
            "logprobs": True,
            "top_logprobs": 0,
            **({"seed": config.sampling_seed} if config.sampling_seed is not None else {}),
            **config.extra_body,
        }
        self.logprobs_mode: str | None = None  # as the server reports it (/v1/models), if it does
        self.max_model_len: int | None = None  # [tokens] as /v1/models reports it (vLLM does)
        self.model_entries: list[dict[str, Any]] = []  # /v1/models' last answer (root, parent)
        # optional fields a 400 naming one drops for the batch: token id requests, cache_salt
        self._id_fields: dict[str, Any] = (
            {"return_token_ids": True} if config.request_token_ids else {}
        )
        if config.cache_salt:
            self._id_fields["cache_salt"] = config.cache_salt
        self._refused: set[str] = set()
        # request fields that are settings (the same on every request): a 400 naming one is a
        # configuration error whenever it comes
        self._setting_fields = [
            *(k for k in CLIENT_FIELDS if k not in ("messages", "model")),
            *config.extra_body,
        ]
        self._fallback_tried = False
        self._rng = random.Random()

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> PolicyClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pooled HTTP connections (safe to call twice)."""
        clients, self._http = self._http, [None] * len(self._http)
        for http in clients:
            if http is not None:
                await http.aclose()

    def _client(self, shard: int = 0) -> httpx.AsyncClient:
        http = self._http[shard]
        if http is None:
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            key = policy_api_key()
            if key:
                headers["Authorization"] = f"Bearer {key}"
            size = (
                min(POOL_SHARD, self.max_inflight - shard * POOL_SHARD)
                if self.max_inflight
                else None
            )
            limits = httpx.Limits(
                max_connections=size, max_keepalive_connections=size or _KEEPALIVE
            )
            if self._ssl is None:  # one TLS context for all shards (~85 ms each to build)
                self._ssl = httpx.create_ssl_context()
            http = self._http[shard] = httpx.AsyncClient(
                headers=headers,
                limits=limits,
                verify=self._ssl,
                timeout=httpx.Timeout(self.config.step_timeout),
                follow_redirects=False,
            )
        return http

    # -- models ----------------------------------------------------------------------------

    async def list_models(self) -> list[str]:
        """Model ids from ``GET {api_base}/models``.

        Raises :class:`PolicyConfigError` when the server is unreachable (naming the URL), does
        not answer within ``min(step_timeout, 30)`` seconds, or answers an error (quoting it).
        """
        url = self.config.api_base + "/models"
        http = self._client()  # made before the deadline: it bounds the server, not TLS setup
        try:
            async with asyncio.timeout(min(self.config.step_timeout, 30.0)):
                resp = await http.get(url)
        except TimeoutError:
            raise PolicyConfigError(
                f"the policy server at {url} did not answer within {min(self.config.step_timeout, 30.0):g} s"
            ) from None
        except httpx.ConnectError as exc:
            raise PolicyConfigError(
                f"cannot reach the policy server at {url}: {_connect_reason(exc)} "
                "(is it running? fix --policy-url)"
            ) from None
        except httpx.TransportError as exc:
            raise PolicyConfigError(
                f"the policy server at {url} failed: {type(exc).__name__}: {redact(str(exc))}"
            ) from None
        if resp.status_code in (401, 403):
            raise PolicyConfigError(
                f"the policy server at {url} refused the API key (HTTP {resp.status_code}): "
                f"{error_text(resp.content)} (fix: set LEGATO_POLICY_KEY)",
                status_code=resp.status_code,
            )
        if resp.status_code != 200:
            raise PolicyConfigError(
                f"GET {url} answered HTTP {resp.status_code}: {error_text(resp.content)} "
                "(is this an OpenAI-compatible server? fix --policy-url)",
                status_code=resp.status_code,
            )
        try:
            data = orjson.loads(resp.content).get("data") or []
            ids = [str(entry["id"]) for entry in data]
            self.model_entries = [dict(entry) for entry in data]
            for entry in data:
                if entry.get("id") != self.config.model:
                    continue
                if entry.get("logprobs_mode"):
                    self.logprobs_mode = str(entry["logprobs_mode"])
                if isinstance(entry.get("max_model_len"), int):
                    self.max_model_len = entry["max_model_len"]
            return ids
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
            raise PolicyConfigError(f"GET {url} did not return an OpenAI model list") from None

    async def get_root(self, path: str) -> httpx.Response | None:
        """``GET`` of ``path`` at the server's root (not under ``/v1``: ``/metrics``,
        SGLang's ``/get_server_info``) with the key, within ``min(step_timeout, 10)`` seconds;
        ``None`` when the server cannot be reached or does not answer in time (probe's reads of
        what a server reports about itself: never an error)."""
        root = self.config.api_base.removesuffix("/v1")
        try:
            async with asyncio.timeout(min(self.config.step_timeout, 10.0)):
                return await self._client().get(root + path)
        except (TimeoutError, httpx.HTTPError):
            return None

    async def check(self) -> list[str]:
        """Cheap pre-batch check: the server answers ``/models`` and serves ``config.model``.

        Returns the model ids offered. Raises :class:`PolicyConfigError` with the server's own
        words when it is unreachable or the model is not listed (naming the models offered).
        """
        models = await self.list_models()
        if self.config.model not in models:
            raise PolicyConfigError(
                f"model {self.config.model!r} is not served at {self.config.api_base}; "
                f"the server offers: {', '.join(models) or '(none)'} (fix: --model)"
            )
        return models

    # -- completions -----------------------------------------------------------------------

    async def complete(
        self,
        messages: list[dict[str, Any]],
        images: Mapping[str, Screenshot] | None = None,
        *,
        seed: int | None = None,
    ) -> PolicyResponse:
        """One chat completion, normalized (see :func:`~legato_pipelines.policy.wire.normalize`).

        ``seed``: this request's ``seed`` (a rollout step's own,
        :meth:`~legato_pipelines.policy.config.PolicyConfig.request_seed`); ``None`` sends
        ``sampling_seed`` when it is set (probe), else no seed.

        ``messages``: OpenAI chat messages; image parts may be references
        ``{"type": "image_url", "image_url": {"url": "legato-image://<sha>"}}`` resolved through
        ``images`` (sha -> Screenshot) when the body is built (once per call, see
        :func:`~legato_pipelines.policy.wire.encode_body`).

        Each HTTP request gets a hard deadline of ``step_timeout`` seconds; up to ``retries``
        re-tries follow timeouts, connection errors, 429, 5xx and server-side failures inside
        an HTTP 200 (``finish_reason: "abort"``: the engine dropped the request, its text or
        tool call is cut; an empty answer: no text, reasoning or tokens) after a full-jitter backoff of
        ``uniform(0, backoff * 2**i)`` seconds (capped at 30 s). The returned record carries
        ``seconds`` (wall time of the call without waiting for an in-flight slot),
        ``attempts`` and ``timeouts``.

        Raises:
          ImageLimitError     400 "At most N image(s) ..." (fix: lower --image-max or raise the
                              server's --limit-mm-per-prompt); at once, no re-try
          ContextLengthError  400 "maximum context length": the prompt outgrew the context; at
                              once (the engine ends that attempt as ``truncated``)
          PolicyRequestError  any other 400 once this client has had an answer: about what this
                              request carries (the engine ends that attempt only); at once
          PolicyConfigError   400 before any answer, 401/403/404 and other 4xx; at once (404
                              lists the models)
          PolicyTimeout       every attempt hit the deadline
          PolicyError         re-tries exhausted otherwise (``status_code`` of the last one)
          ValueError          a message refers to an image not in ``images``
        """
        cfg = self.config
        attempts = timeouts = aborts = 0
        elapsed = 0.0
        fields = self._fields if seed is None else {**self._fields, "seed": seed}
        body_fields = self._id_fields
        body = encode_body({**fields, **body_fields, "messages": messages}, images)
        failure: _Retryable | None = None
        while True:
            if body_fields is not self._id_fields:  # another call dropped or added a field
                body_fields = self._id_fields
                body = encode_body({**fields, **body_fields, "messages": messages}, images)
            attempts += 1
            try:
                status, content, seconds = await self._post(body)
            except _Retryable as exc:
                failure = exc
                timeouts += exc.timeout
                elapsed += exc.seconds
            else:
                elapsed += seconds
                if status == 200:
                    try:
                        payload = orjson.loads(content)
                        result = normalize(payload, asked_ids="return_token_ids" in body_fields)
                    except (
                        orjson.JSONDecodeError,
                        ValueError,
                        TypeError,
                        KeyError,
                        AttributeError,
                    ) as exc:
                        failure = _Retryable(
                            f"unreadable answer from {self._url}: {type(exc).__name__}: {redact(str(exc))}"
                        )
                    else:
                        if (why := _server_failure(result)) is None:
                            self.answered += 1
                            if aborts:
                                result.notes.append(f"server_aborts: {aborts}")
                            return self._finish(result, body_fields, elapsed, attempts, timeouts)
                        aborts += 1
                        failure = _Retryable(f"{why} from {self._url}")
                else:
                    message = error_text(content)
                    if status == 400 and (field := refused_field(message, list(body_fields))):
                        self._refuse(field, message)
                        continue  # the same call without the field; not a re-try
                    if status == 400 and context_length(message):
                        raise ContextLengthError(
                            f"the prompt no longer fits the model's context (HTTP 400): {message} "
                            f"(fix: lower --image-max or --max-tokens (now {cfg.max_tokens}), or "
                            "raise the server's --max-model-len)",
                            attempts=attempts,
                            status_code=status,
                        )
                    if (
                        status == 400
                        and self.answered
                        and image_limit(message) is None
                        and not refused_field(message, self._setting_fields)
                    ):
                        # the same settings were answered before: this request's content
                        raise PolicyRequestError(
                            f"the policy server refused this request (HTTP 400) although it "
                            f"answered {self.answered} with the same settings: {message} (the "
                            "attempt ends here, the batch goes on)",
                            attempts=attempts,
                            status_code=status,
                        )
                    if status < 500 and status not in RETRY_STATUSES:
                        raise await self._config_error(status, message, attempts)
                    failure = _Retryable(
                        f"HTTP {status} from {self._url}: {message}", status_code=status
                    )
            if attempts > cfg.retries:
                break
            delay = self._rng.uniform(0.0, min(BACKOFF_CAP_S, cfg.backoff * 2 ** (attempts - 1)))
            log.info(
                "policy call attempt %d failed (%s); re-trying in %.2f s", attempts, failure, delay
            )
            await asyncio.sleep(delay)
            elapsed += delay
        assert failure is not None
        if timeouts == attempts:
            raise PolicyTimeout(
                f"no answer from {self._url} within step_timeout={cfg.step_timeout:g} s "
                f"on {attempts} attempt(s)",
                attempts=attempts,
            )
        raise PolicyError(
            f"policy call failed after {attempts} attempt(s) ({timeouts} timed out); last: {failure}",
            attempts=attempts,
            status_code=failure.status_code,
        )

    async def _post(self, body: bytes) -> tuple[int, bytes, float]:
        """One HTTP request under the in-flight bound and the hard deadline: (status, body,
        seconds spent after getting an in-flight slot)."""
        if self._slots is None:
            return await self._post_once(self._client(), body)
        shard = await self._slots.get()
        try:
            return await self._post_once(self._client(shard), body)
        finally:
            self._slots.put_nowait(shard)

    async def _post_once(self, http: httpx.AsyncClient, body: bytes) -> tuple[int, bytes, float]:
        timeout = self.config.step_timeout
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                resp = await http.post(self._url, content=body)
        except (TimeoutError, httpx.TimeoutException):
            raise _Retryable(
                f"timed out after {timeout:g} s (step_timeout)",
                timeout=True,
                seconds=time.perf_counter() - t0,
            ) from None
        except httpx.TransportError as exc:
            raise _Retryable(
                f"{type(exc).__name__} talking to {self._url}: {redact(str(exc))}",
                seconds=time.perf_counter() - t0,
            ) from None
        # httpx's Response and its BoundAsyncStream refer to each other: a reference cycle (of
        # ~17 objects with the pool's stream objects) per call that only the cyclic garbage
        # collector frees, and that makes it run (and scan the heap) ever more often. The body
        # is read and the stream closed: break the cycle so reference counting frees it all.
        resp.stream = None
        return resp.status_code, resp.content, time.perf_counter() - t0

    def _refuse(self, field: str, message: str) -> None:
        """Drop an optional field the server refused (400), for the rest of the batch."""
        if field not in self._id_fields:
            return
        self._id_fields = {k: v for k, v in self._id_fields.items() if k != field}
        self._refused.add(field)
        if field == "return_token_ids":
            self.token_ids_dropped = True
        if field == "cache_salt":
            self.cache_salt_dropped = True
            log.warning(
                "the policy server refused cache_salt (%s); dropped for the rest of the batch: "
                "its prefix cache is not kept apart per checkpoint",
                message,
            )
            return
        log.warning(
            "the policy server refused %s (%s); dropped for the rest of the batch, logprobs kept",
            field,
            message,
        )

    def _finish(
        self,
        result: PolicyResponse,
        body_fields: Mapping[str, bool],
        elapsed: float,
        attempts: int,
        timeouts: int,
    ) -> PolicyResponse:
        result.seconds = elapsed
        result.attempts = attempts
        result.timeouts = timeouts
        if self.token_ids_dropped:
            result.notes.insert(0, "token_ids_dropped")
        if self.cache_salt_dropped:
            result.notes.append("cache_salt_dropped")
        if result.token_ids is None and "return_token_ids" in body_fields:
            self.token_ids_ignored = True
            if not self._fallback_tried:
                # vLLM < 0.10.2 / older SGLang accept and ignore return_token_ids: ask the
                # older ways on later calls (refused ones are dropped again on a 400).
                self._fallback_tried = True
                extra = {f: True for f in TOKEN_ID_FIELDS if f not in self._refused}
                self._id_fields = {**self._id_fields, **extra}
                log.info(
                    "the policy server returned no token ids for return_token_ids; also asking "
                    "for return_tokens_as_token_ids / return_output_ids from now on"
                )
        return result

    async def _config_error(self, status: int, message: str, attempts: int) -> PolicyConfigError:
        """The fail-fast error for a 4xx answer, with the fix."""
        url = self._url
        if status == 400 and (limit := image_limit(message)) is not None:
            return ImageLimitError(
                f"the policy server accepts at most {limit} image(s) per prompt: {message} "
                f"(fix: lower --image-max to {limit} or raise the server's --limit-mm-per-prompt)",
                limit=limit,
                attempts=attempts,
                status_code=status,
            )
        if status in (401, 403):
            return PolicyConfigError(
                f"the policy server at {url} refused the API key (HTTP {status}): {message} "
                "(fix: set LEGATO_POLICY_KEY)",
                attempts=attempts,
                status_code=status,
            )
        if status == 404:
            try:
                offered = ", ".join(await self.list_models()) or "(none)"
            except PolicyConfigError as exc:
                offered = f"(could not list models: {exc})"
            return PolicyConfigError(
                f"HTTP 404 from {url}: {message}; model {self.config.model!r}, the server offers: "
                f"{offered} (fix: --model, or --policy-url if the path is wrong)",
                attempts=attempts,
                status_code=status,
            )
        return PolicyConfigError(
            f"the policy server rejected the request (HTTP {status}): {message}",
            attempts=attempts,
            status_code=status,
        )
