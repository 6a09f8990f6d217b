"""The scripted policy server: a real OpenAI-compatible HTTP server that is NOT a model.

It answers ``/v1/chat/completions`` in the Qwen computer-use format from a script (one response
per step, per task instruction) or from deterministic defaults, with synthetic token ids and
logprobs, prefix-cache accounting and injectable faults. For tests, the README demo, benchmarks
of the engine, and wiring up a trainer before a model exists.

Script (JSON file or dict)::

    {"tasks": {"<instruction text or a substring of it>": ["response step 0", "response step 1"]},
     "default": ["..."]}

A response is a string, ``{"content": str, "reasoning": str}``, or ``{"sample": [response,
...]}``: one of those responses drawn by the request's ``seed`` (the same seed draws the same
one, as vLLM's seeded sampling gives the same tokens; no seed: drawn at random). The task's script is the
longest key found in the first user message's text (the engine puts the instruction there);
the step is the number of assistant messages in the request; past the end of a script the last
response repeats. No match and no ``default``: :func:`~.synthetic.default_responses`.

Flavors mimic the wire format of each server (``docs/wire-formats.md``):

=========  ================================  ==============  =================  ===========
flavor     token ids                         error envelope  reasoning field    unknown
=========  ================================  ==============  =================  ===========
vllm       top-level prompt_token_ids,       nested          reasoning          ignored
           choices[].token_ids
vllm-old   only via return_tokens_as_token_  flat            reasoning_content  ignored
           ids ("token_id:N" logprob tokens)
sglang     per-choice prompt_token_ids and   flat            reasoning_content  ignored
           token_ids; sglext.output_ids
openai     none (tokens + bytes)             nested          (none)             400
=========  ================================  ==============  =================  ===========

Cached tokens: vLLM and SGLang report ``usage.prompt_tokens_details.cached_tokens`` only when
non-zero; OpenAI always reports it.

Loading checkpoints (the routes RL teams use to put a new policy version into a running server;
:mod:`legato_pipelines.policy.loading` is the client side):

=========================  ==========================================================  ==========
route                      what it does here                                           flavors
=========================  ==========================================================  ==========
/v1/load_lora_adapter      ``{lora_name, lora_path}``: the folder (with                vllm,
/v1/unload_lora_adapter    ``adapter_config.json``) becomes model id ``lora_name``     vllm-old
                           (listed in ``/v1/models`` with ``root`` = path, ``parent``
                           = the base model); only when runtime LoRA updating is on
                           (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, as vLLM), else 404
``weights_route``          vLLM has no full-weights route of its own; teams add one    vllm,
(e.g. /update_weights)     (prime-rl's ``/update_weights``). ``{"model_path": path}``  vllm-old
                           (key ``weights_key``) loads the folder (with
                           ``config.json``) as the base model's weights
/load_lora_adapter         SGLang's: ``{lora_name, lora_path}`` -> ``{success,          sglang
/unload_lora_adapter       error_message, loaded_adapters}``; the adapter is called
                           as model ``<base>:<lora_name>`` or with ``lora_path``
/update_weights_from_disk  ``{model_path}`` -> ``{success, message}``; the new path    sglang
/get_model_info            is reported as ``model_path`` by ``/get_model_info``
=========================  ==========================================================  ==========

What real vLLM 0.32 does that the client must cope with (issue 31), each a switch:
``reasoning_parser`` (``--reasoning-parser``: the text before ``</think>`` goes to the
reasoning field; with no ``</think>`` the whole answer does and ``content`` is null),
``tool_call_parser`` (``--tool-call-parser hermes``: ``<tool_call>`` blocks leave the text for
``message.tool_calls``, ``finish_reason`` ``tool_calls``), ``Faults.shorten_to_context``
(prompt + ``max_tokens`` over ``max_model_len``: the output is shortened to fit, HTTP 200,
``finish_reason: length``, instead of a 400), ``Faults.reject_text`` (a 400 for one prompt's
content), ``Faults.image_limit`` (vLLM's image-limit 400), ``cache_salt`` and adapters in the
prefix cache (below), the ``seed`` (above), ``block_size`` (reported on ``/metrics`` as vLLM's
``vllm:cache_config_info`` and by SGLang's ``/get_server_info`` as ``page_size``).

Prefix cache: vLLM keys an adapter's blocks by its name and path and a request's
``cache_salt`` (the first block's hash), not by its weights: an adapter reloaded under the same
name from a rewritten folder is answered from KV the old weights computed.
:attr:`RequestLog.stale_cached_tokens` counts such tokens (cached by other weights than those
answering). The ``sglang`` flavor keys an adapter's blocks by each load and flushes its cache
on a full-weights update (assumed, not checked against a running SGLang: docs/wire-formats.md
§2), so it serves none.

Every chat request is answered by the weights loaded at that moment: :attr:`RequestLog.served`
and the response's ``system_fingerprint`` (``...:served=<name>``) name them (an adapter's
name, or the folder name of the full weights last loaded; the model id before any load), so a
test proves which weights served each request. (Real vLLM's ``system_fingerprint`` proves
nothing of the kind: it hashes the server's config, the same for every adapter.)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .synthetic import IMAGE_PAD_ID, PrefixCache, SyntheticTokenizer, default_responses, image_key

log = logging.getLogger(__name__)

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
class _Flavor:
    nested_errors: bool
    reasoning_key: str | None
    ids: Literal["top", "choice", None]  # where return_token_ids puts prompt ids
    token_id_strings: bool  # honours return_tokens_as_token_ids
    sglext: bool  # honours return_output_ids / return_input_ids
    strict_fields: bool
    cached_always: bool
    image_limit_scope: str  # "prompt" (vLLM >= 0.9) or "request" (older chat_utils tracker)


_FLAVORS: dict[str, _Flavor] = {
    "vllm": _Flavor(True, "reasoning", "top", True, False, False, False, "prompt"),
    "vllm-old": _Flavor(False, "reasoning_content", None, True, False, False, False, "request"),
    "sglang": _Flavor(False, "reasoning_content", "choice", False, True, False, False, "prompt"),
    "openai": _Flavor(True, None, None, False, False, True, True, "prompt"),
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


class _Reject(Exception):
    def __init__(
        self, status: int, message: str, *, kind: str = "BadRequestError", param: str | None = None
    ):
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


class ScriptedPolicyServer:
    """An OpenAI-compatible policy server answering from a script. It is NOT a model.

    Args:
      flavor      ``vllm`` | ``sglang`` | ``openai`` | ``vllm-old`` (wire format, see module doc)
      script      ``None`` | dict | path to a JSON script
      model       the model id served (``/v1/models``; other names get a 404)
      host, port  where to listen; port 0 picks a free port (see :attr:`url`)
      faults      :class:`Faults` to inject
      latency     seconds (fixed) or :class:`Latency`
      api_key     require ``Authorization: Bearer <api_key>`` (401 otherwise)
      image_tokens  prompt tokens counted per image
      record_bodies keep each chat request's raw body in :attr:`requests` (tests)
      logprobs_mode report this on ``/v1/models`` (``None``: not reported, as vLLM and SGLang)
      runtime_lora  vLLM flavors: serve ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
                  (``None``: when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is true in the environment
                  at construction, as vLLM decides at start-up)
      weights_route vLLM flavors: path of a full-weights route (e.g. ``/update_weights``), or
                  ``None`` for none (stock vLLM); ``weights_key`` names its path field
      enable_lora   SGLang flavor: the LoRA routes work (``--enable-lora``); off, they answer 400
      reasoning_parser  vLLM / SGLang flavors: as ``--reasoning-parser`` (module doc)
      tool_call_parser  vLLM / SGLang flavors: as ``--tool-call-parser hermes`` (module doc)
      block_size    [tokens] the prefix cache's block (vLLM: 16 on GPUs, 128 on CPUs; SGLang's
                    ``page_size``)
      sample_order  how an unseeded request draws from a ``{"sample": [...]}`` entry: ``random``
                    (default, the server's own randomness) or ``cycle`` (the options in turn per
                    script entry: the n-th request for that task and step gets option n mod k, so a
                    group of k or more attempts sees every option; ``legato demo``)

    ``start()`` runs it in a background thread and returns once it listens; ``stop()`` ends it;
    also a context manager. ``serve_forever()`` runs it in the calling thread until
    SIGINT/SIGTERM (the CLI). :attr:`requests` logs every request (bounded);
    :attr:`peak_inflight` is the most chat requests it answered at once.
    """

    def __init__(
        self,
        flavor: str = "vllm",
        script: None | str | Path | dict = None,
        model: str = "scripted-qwen",
        host: str = "127.0.0.1",
        port: int = 0,
        faults: Faults | None = None,
        latency: float | Latency | None = None,
        *,
        api_key: str | None = None,
        image_tokens: int = 64,
        record_bodies: bool = False,
        max_log: int = 100_000,
        logprobs_mode: str | None = None,
        runtime_lora: bool | None = None,
        weights_route: str | None = None,
        weights_key: str = "model_path",
        enable_lora: bool = True,
        reasoning_parser: bool = False,
        tool_call_parser: bool = False,
        block_size: int = 16,
        sample_order: str = "random",
    ):
        if flavor not in _FLAVORS:
            raise ValueError(
                f"flavor must be one of {', '.join(FLAVORS)}, got {flavor!r} (fix: --flavor)"
            )
        self.flavor = flavor
        self._flavor = _FLAVORS[flavor]
        self.script = load_script(script)
        self.model = model
        self.host = host
        self.port = port
        self.faults = faults or Faults()
        self.latency = latency if isinstance(latency, Latency) else Latency(float(latency or 0.0))
        self.api_key = api_key
        self.image_tokens = image_tokens
        self.record_bodies = record_bodies
        self.logprobs_mode = logprobs_mode
        self.prompt_ids_sent: list[list[int]] = []  # prompt ids of every answer that sent them
        self.requests: collections.deque[RequestLog] = collections.deque(maxlen=max_log)
        self.request_count = 0  # chat requests
        self.inflight = 0  # chat requests being answered now
        self.peak_inflight = 0  # most chat requests answered at once
        self.tokenizer = SyntheticTokenizer()
        self.block_size = block_size
        self.prefix_cache = PrefixCache(block_size=block_size)
        self.reasoning_parser = reasoning_parser
        self.tool_call_parser = tool_call_parser
        if sample_order not in ("random", "cycle"):
            raise ValueError(f"sample_order must be 'random' or 'cycle', got {sample_order!r}")
        self.sample_order = sample_order
        self._sample_rng = random.Random()  # unseeded requests: the server's own randomness
        self._sample_turns: collections.Counter[tuple[int, int]] = collections.Counter()
        self._generation = 0  # counts loads: the weights that computed a cached block
        self._weights_generation = 0
        self._adapter_generation: dict[str, int] = {}
        self._fault_rng = random.Random(self.faults.seed)
        self._defaults: dict[str, list[str]] = {}
        self._stopping = False
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        if runtime_lora is None:
            runtime_lora = os.environ.get(RUNTIME_LORA_ENV, "").lower() in ("1", "true")
        self.runtime_lora = runtime_lora
        self.weights_route = weights_route
        self.weights_key = weights_key
        self.enable_lora = enable_lora
        self.adapters: dict[str, str] = {}  # LoRA name -> folder, in load order
        self.weights = model  # name of the full weights served (a folder name once loaded)
        self.weights_path: str = model  # what SGLang's /get_model_info reports as model_path
        self.loads: list[tuple[str, str, str]] = []  # (route, name, path) of each load, in order
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
        ]
        if flavor.startswith("vllm"):
            routes.append(Route("/metrics", self._vllm_metrics, methods=["GET"]))
            if runtime_lora:
                routes += [
                    Route("/v1/load_lora_adapter", self._vllm_load_lora, methods=["POST"]),
                    Route("/v1/unload_lora_adapter", self._vllm_unload_lora, methods=["POST"]),
                ]
            if weights_route:
                routes.append(
                    Route(weights_route, self._vllm_weights_route, methods=["GET", "POST"])
                )
        elif flavor == "sglang":
            routes += [
                Route("/load_lora_adapter", self._sglang_load_lora, methods=["POST"]),
                Route("/unload_lora_adapter", self._sglang_unload_lora, methods=["POST"]),
                Route("/update_weights_from_disk", self._sglang_update_weights, methods=["POST"]),
                Route("/get_model_info", self._sglang_model_info, methods=["GET"]),
                Route("/get_server_info", self._sglang_server_info, methods=["GET"]),
            ]
        self.app = Starlette(routes=routes)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (the actual port once started)."""
        return f"http://{self.host}:{self.port}"

    def _uvicorn(self, *, log_config: Any) -> tuple[uvicorn.Server, socket.socket]:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        # listening before the URL is announced: a client that connects at once waits in the
        # backlog until uvicorn accepts, instead of being refused (uvicorn listens again)
        sock.listen(4096)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=log_config,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            backlog=4096,
        )
        return uvicorn.Server(config), sock

    def start(self, timeout: float = 10.0) -> ScriptedPolicyServer:
        """Serve in a background thread; return once listening. Raises ``RuntimeError`` if not."""
        if self._thread is not None:
            return self
        self._stopping = False
        self._server, sock = self._uvicorn(log_config=None)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            name=f"scripted-policy-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"scripted policy server did not start on {self.url}")
            time.sleep(0.005)
        log.info("%s, flavor %s, model %s, at %s", NOT_A_MODEL, self.flavor, self.model, self.url)
        return self

    def stop(self) -> None:
        """Stop serving and join the thread (hung requests are abandoned)."""
        self._stopping = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None
        self._server = None

    def serve_forever(self) -> None:
        """Serve in the calling thread until SIGINT/SIGTERM (uvicorn's signal handling)."""
        server, sock = self._uvicorn(log_config=uvicorn.config.LOGGING_CONFIG)
        self._server = server
        log.warning(
            "%s, flavor %s, model %s, at %s", NOT_A_MODEL, self.flavor, self.model, self.url
        )
        try:
            server.run(sockets=[sock])
        finally:
            self._server = None

    def __enter__(self) -> ScriptedPolicyServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def chat_requests(self) -> list[RequestLog]:
        """The logged chat-completion requests, oldest first."""
        return [r for r in list(self.requests) if r.path == "/v1/chat/completions"]

    # -- endpoints -------------------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        return Response(b"", status_code=200)

    async def _models(self, request: Request) -> Response:
        entry = RequestLog(seq=0, path="/v1/models")
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:
            return err
        model = {
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "legato-scripted (not a model)",
            "root": self.model,
            "max_model_len": self.faults.max_model_len or 32768,
        }
        if self.logprobs_mode:
            model["logprobs_mode"] = self.logprobs_mode
        data = [model]
        if self.flavor.startswith("vllm"):  # vLLM lists LoRA adapters: root = path, parent = base
            data += [
                {**model, "id": name, "root": path, "parent": self.model}
                for name, path in self.adapters.items()
            ]
        return Response(
            orjson.dumps({"object": "list", "data": data}), media_type="application/json"
        )

    async def _vllm_metrics(self, request: Request) -> Response:
        """A few lines of vLLM's Prometheus ``/metrics``: ``vllm:cache_config_info`` (its labels
        are the cache config, ``block_size`` among them)."""
        text = (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",cache_dtype="auto",'
            'enable_prefix_caching="True",prefix_caching_hash_algo="sha256"} 1.0\n'
        )
        return Response(text.encode(), media_type="text/plain; version=0.0.4")

    async def _sglang_server_info(self, request: Request) -> Response:
        entry = RequestLog(seq=0, path="/get_server_info")
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:
            return err
        info = {"model_path": self.weights_path, "page_size": self.block_size, "version": "0"}
        return Response(orjson.dumps(info), media_type="application/json")

    def _new_generation(self) -> int:
        self._generation += 1
        return self._generation

    # -- loading checkpoints (module doc) ----------------------------------------------------

    async def _load_request(self, request: Request, path: str) -> tuple[dict, Response | None]:
        """The JSON body of a load/unload request (logged), or an error response."""
        entry = RequestLog(seq=0, path=path)
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:
            return {}, err
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            body = None
            message = f"request body is not JSON: {exc}"
        else:
            message = "request body must be a JSON object"
        if not isinstance(body, dict):
            entry.status = 400
            return {}, self._error(_Reject(400, message))
        entry.fields = tuple(body)
        return body, None

    @staticmethod
    def _text(text: str, status: int = 200) -> Response:
        return Response(orjson.dumps(text), status_code=status, media_type="application/json")

    async def _vllm_load_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/v1/load_lora_adapter")
        if err is not None:
            return err
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return self._error(_Reject(400, "Both 'lora_name' and 'lora_path' must be provided."))
        if name in self.adapters:
            return self._error(
                _Reject(
                    400, f"The lora adapter '{name}' has already been loaded.", param="lora_name"
                )
            )
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            return self._error(
                _Reject(
                    404,
                    f"Loading lora {name} failed: No adapter found for {path}",
                    kind="NotFoundError",
                    param="lora_path",
                )
            )
        self.adapters[name] = path
        self._adapter_generation[name] = self._new_generation()
        self.loads.append(("/v1/load_lora_adapter", name, path))
        return self._text(f"Success: LoRA adapter '{name}' added successfully.")

    async def _vllm_unload_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/v1/unload_lora_adapter")
        if err is not None:
            return err
        name = body.get("lora_name")
        if name not in self.adapters:
            return self._error(
                _Reject(
                    404,
                    f"The lora adapter '{name}' cannot be found.",
                    kind="NotFoundError",
                    param="lora_name",
                )
            )
        del self.adapters[name]
        return self._text(f"Success: LoRA adapter '{name}' removed successfully.")

    async def _vllm_weights_route(self, request: Request) -> Response:
        """``POST`` loads (below); ``GET`` answers ``{weights_key: the folder served}`` (how a
        team's route can tell what it loaded last; legato re-checks it after a run)."""
        if request.method == "GET":
            if (err := self._auth(request, RequestLog(seq=0, path=request.url.path))) is not None:
                return err
            return Response(
                orjson.dumps({self.weights_key: self.weights_path}), media_type="application/json"
            )
        return await self._vllm_load_weights(request)

    async def _vllm_load_weights(self, request: Request) -> Response:
        route = self.weights_route or ""
        body, err = await self._load_request(request, route)
        if err is not None:
            return err
        path = body.get(self.weights_key)
        if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
            return self._error(
                _Reject(400, f"cannot load weights from {path!r}: no config.json there")
            )
        self._set_weights(route, path)
        return Response(
            orjson.dumps({"status": "ok", self.weights_key: path}), media_type="application/json"
        )

    def _set_weights(self, route: str, path: str) -> None:
        self.weights = os.path.basename(os.path.normpath(path))
        self.weights_path = path
        self._weights_generation = self._new_generation()
        if self.flavor == "sglang":  # SGLang flushes its cache when it updates weights
            self.prefix_cache.clear()
        self.loads.append((route, self.weights, path))

    async def _sglang_load_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/load_lora_adapter")
        if err is not None:
            return err
        name, path = body.get("lora_name"), body.get("lora_path")
        error = None
        if not self.enable_lora:
            error = "LoRA is not enabled. Please set `--enable-lora` to True."
        elif not name or not path:
            error = "lora_name and lora_path are required"
        elif name in self.adapters:
            error = f"Failed to load LoRA adapter {name}: LoRA adapter {name} is already loaded."
        elif not os.path.isfile(os.path.join(path, "adapter_config.json")):
            error = f"Failed to load LoRA adapter {name}: no adapter_config.json in {path}"
        if error is None:
            self.adapters[name] = path
            self._adapter_generation[name] = self._new_generation()
            self.loads.append(("/load_lora_adapter", name, path))
        return self._sglang_answer(error, error_key="error_message", loaded=True)

    async def _sglang_unload_lora(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/unload_lora_adapter")
        if err is not None:
            return err
        name = body.get("lora_name")
        error = None
        if not self.enable_lora:
            error = "LoRA is not enabled. Please set `--enable-lora` to True."
        elif name not in self.adapters:
            error = f"LoRA adapter {name} is not loaded."
        else:
            del self.adapters[name]
        return self._sglang_answer(error, error_key="error_message", loaded=True)

    async def _sglang_update_weights(self, request: Request) -> Response:
        body, err = await self._load_request(request, "/update_weights_from_disk")
        if err is not None:
            return err
        path = body.get("model_path")
        error = None
        if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
            error = f"Failed to update weights: cannot load model from {path!r} (no config.json)."
        else:
            self._set_weights("/update_weights_from_disk", path)
        return self._sglang_answer(error, error_key="message")

    def _sglang_answer(
        self, error: str | None, *, error_key: str, loaded: bool = False
    ) -> Response:
        body: dict[str, Any] = {"success": error is None, error_key: error or ""}
        if error_key == "message" and error is None:
            body["message"] = "Succeeded to update model weights."
            body["num_paused_requests"] = 0
        if loaded:
            body["loaded_adapters"] = dict(self.adapters)
        return Response(
            orjson.dumps(body),
            status_code=200 if error is None else 400,
            media_type="application/json",
        )

    async def _sglang_model_info(self, request: Request) -> Response:
        entry = RequestLog(seq=0, path="/get_model_info")
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:  # SGLang's --api-key covers it
            return err
        return Response(
            orjson.dumps(
                {
                    "model_path": self.weights_path,
                    "tokenizer_path": self.model,
                    "is_generation": True,
                    "preferred_sampling_params": None,
                    "weight_version": "default",
                }
            ),
            media_type="application/json",
        )

    def _served(self, model: Any, req: dict[str, Any]) -> str | None:
        """The weights a chat request for ``model`` is answered by, or ``None`` when the model
        is not served. vLLM: the base model id or an adapter's name; SGLang: the base model id,
        ``<base>:<adapter>``, or the base with ``lora_path`` naming an adapter."""
        if model == self.model:
            lora = req.get("lora_path") if self.flavor == "sglang" else None
            if lora is None:
                return self.weights
            return lora if lora in self.adapters else None
        if not isinstance(model, str):
            return None
        if self.flavor.startswith("vllm") and model in self.adapters:
            return model
        if self.flavor == "sglang":
            base, sep, name = model.rpartition(":")
            if sep and base == self.model and name in self.adapters:
                return name
        return None

    def _auth(self, request: Request, entry: RequestLog) -> Response | None:
        header = request.headers.get("authorization", "")
        entry.bearer = header.startswith("Bearer ")
        if self.api_key is None:
            return None
        entry.authorized = header == f"Bearer {self.api_key}"
        if entry.authorized:
            return None
        entry.status = 401
        if self.flavor.startswith("vllm"):  # vLLM's API-key middleware
            return Response(
                orjson.dumps({"error": "Unauthorized"}),
                status_code=401,
                media_type="application/json",
            )
        given = header.removeprefix("Bearer ")
        # Quotes the key it got, in full (OpenAI masks it): the client must redact.
        return self._error(
            _Reject(401, f"Incorrect API key provided: {given}.", kind="invalid_request_error")
        )

    def _error(self, rej: _Reject) -> Response:
        if self._flavor.nested_errors:
            body = {
                "error": {
                    "message": rej.message,
                    "type": rej.kind,
                    "param": rej.param,
                    "code": rej.status,
                }
            }
        else:
            body = {
                "object": "error",
                "message": rej.message,
                "type": rej.kind,
                "param": rej.param,
                "code": rej.status,
            }
        return Response(orjson.dumps(body), status_code=rej.status, media_type="application/json")

    async def _chat(self, request: Request) -> Response:
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            return await self._chat_inner(request)
        finally:
            self.inflight -= 1

    async def _chat_inner(self, request: Request) -> Response:
        self.request_count += 1
        seq = self.request_count
        entry = RequestLog(seq=seq, path="/v1/chat/completions")
        self.requests.append(entry)
        if (err := self._auth(request, entry)) is not None:
            return err
        raw = await request.body()
        if self.record_bodies:
            entry.body = raw
        try:
            reply = self._answer(raw, entry)
        except _Reject as rej:
            entry.status = rej.status
            return self._error(rej)
        faults = self.faults
        if faults.hang_every and seq % faults.hang_every == 0:
            entry.fault = "hang"
            if faults.hang_mode == "trickle":
                return StreamingResponse(self._trickle(reply), media_type="application/json")
            await self._hang(request)
            return Response(reply, media_type="application/json")
        if (faults.error_every and seq % faults.error_every == 0) or (
            faults.error_rate and self._fault_rng.random() < faults.error_rate
        ):
            entry.fault = entry.fault or "error"
            entry.status = faults.error_status
            return self._error(
                _Reject(
                    faults.error_status,
                    f"scripted fault: injected HTTP {faults.error_status}",
                    kind="InternalServerError",
                )
            )
        delay = self.latency.sample()
        if delay > 0:
            await asyncio.sleep(delay)
        return Response(reply, media_type="application/json")

    async def _hang(self, request: Request) -> None:
        deadline = time.monotonic() + self.faults.hang_seconds
        while time.monotonic() < deadline and not self._stopping:
            await asyncio.sleep(0.05)
            if await request.is_disconnected():
                return

    async def _trickle(self, reply: bytes):
        deadline = time.monotonic() + self.faults.hang_seconds
        while time.monotonic() < deadline and not self._stopping:
            yield b" "
            await asyncio.sleep(self.faults.trickle_interval)
        yield reply

    # -- the answer ------------------------------------------------------------------------

    def _answer(self, raw: bytes, entry: RequestLog) -> bytes:
        """The chat completion body for a request, or raise :class:`_Reject`."""
        fl = self._flavor
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _Reject(400, f"request body is not JSON: {exc}") from None
        if not isinstance(req, dict):
            raise _Reject(400, "request body must be a JSON object")
        entry.fields = tuple(req)
        if fl.strict_fields or self.faults.reject_unknown_fields:
            for name in req:
                if name not in OPENAI_FIELDS:
                    raise _Reject(
                        400,
                        f"Unrecognized request argument supplied: {name}",
                        kind="invalid_request_error",
                    )
        model = req.get("model")
        served = self._served(model, req)
        if served is None:
            raise _Reject(
                404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model"
            )
        entry.served = served
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _Reject(400, "messages must be a non-empty list", param="messages")
        if req.get("stream"):
            raise _Reject(
                400, "the scripted policy server does not stream (set stream=false)", param="stream"
            )
        if req.get("n", 1) != 1:
            raise _Reject(400, "the scripted policy server answers n=1 only", param="n")

        seed, salt = req.get("seed"), req.get("cache_salt")
        entry.seed = seed if isinstance(seed, int) else None
        entry.cache_salt = salt if isinstance(salt, str) else None
        if salt is not None and (not isinstance(salt, str) or not salt):
            # vLLM's protocol check of the field
            raise _Reject(400, "Parameter 'cache_salt' must be a non-empty string if provided.")
        reject = self.faults.reject_text
        if reject and reject.encode() in raw:
            raise _Reject(
                400,
                "The prompt could not be processed: a message holds content this server "
                f"refuses ({reject!r}).",
                param="messages",
            )

        keys, prompt_ids, instruction, n_images, step = self._prompt(messages)
        entry.n_images = n_images
        entry.step = step
        limit = self.faults.image_limit
        if limit is not None and n_images > limit:
            msg = f"At most {limit} image(s) may be provided in one {fl.image_limit_scope}."
            if fl.image_limit_scope == "prompt":
                msg += " Set `--limit-mm-per-prompt` to increase this limit."
            raise _Reject(400, msg, param="image")

        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 1 << 30
        max_len = self.faults.max_model_len
        if (
            max_len
            and self.faults.shorten_to_context
            and len(prompt_ids) < max_len < len(prompt_ids) + max_tokens
        ):
            max_tokens = max_len - len(prompt_ids)  # vLLM 0.32: cut the output at the context
        if max_len and len(prompt_ids) + min(max_tokens, max_len) > max_len:
            total = len(prompt_ids) + max_tokens
            if self.flavor == "sglang":
                msg = (
                    f"Requested token count exceeds the model's maximum context length of "
                    f"{max_len} tokens. You requested a total of {total} tokens: "
                    f"{len(prompt_ids)} tokens from the input messages and {max_tokens} tokens "
                    "for the completion. Please reduce the number of tokens in the input "
                    "messages or the completion to fit within the limit."
                )
            else:
                msg = (
                    f"This model's maximum context length is {max_len} tokens. However, you "
                    f"requested {total} tokens ({len(prompt_ids)} in the messages, {max_tokens} "
                    "in the completion). Please reduce the length of the messages or completion."
                )
            raise _Reject(400, msg, param="messages")
        content, reasoning = self._script_step(instruction, step, entry.seed)
        text = content if not reasoning else f"{reasoning}\n</think>\n\n{content}"
        tokens = self.tokenizer.tokenize(text)
        finish = "stop"
        faults = self.faults
        seq = entry.seq
        if faults.empty_every and seq % faults.empty_every == 0:
            entry.fault = "empty"
            tokens, content, reasoning = [], "", None
        elif faults.abort_every and seq % faults.abort_every == 0:
            entry.fault = "abort"
            tokens = tokens[: faults.abort_tokens]
            content, reasoning, text = "".join(tokens), None, "".join(tokens)
            finish = "abort"
        if finish == "stop" and len(tokens) > max_tokens:
            tokens = tokens[:max_tokens]
            finish = "length"
            text = "".join(tokens)
            if reasoning:
                head, sep, tail = text.partition("\n</think>\n\n")
                reasoning, content = (head, tail) if sep else (head, "")
            else:
                content = text
        token_id = self.tokenizer.token_id
        ids = [token_id(t) for t in tokens]
        tool_calls: list[dict[str, Any]] = []
        if self._flavor.reasoning_key and self.reasoning_parser and finish != "abort":
            content, reasoning = _reasoning_parser("".join(tokens))
        if self._flavor.reasoning_key and self.tool_call_parser and content:
            content, tool_calls = _tool_call_parser(content)
            if tool_calls and finish == "stop":
                finish = "tool_calls"
        namespace, tag = self._cache_keys(served, model, entry.cache_salt)
        cached = self.prefix_cache.lookup_and_insert(keys, namespace, tag)
        entry.cached_tokens = cached
        entry.stale_cached_tokens = self.prefix_cache.last_stale
        body = self._body(req, prompt_ids, content, reasoning, tokens, ids, finish, cached, seq)
        if tool_calls:
            body["choices"][0]["message"]["tool_calls"] = tool_calls
        if body.get("prompt_token_ids") is not None or body["choices"][0].get("prompt_token_ids"):
            self.prompt_ids_sent.append(prompt_ids)
        body["model"] = model  # vLLM answers with the adapter's name for an adapter request
        body["system_fingerprint"] = f"legato-scripted-not-a-model:served={served}"
        return orjson.dumps(body)

    def _prompt(self, messages: list[Any]) -> tuple[list[int], list[int], str, int, int]:
        """(prompt keys, prompt token ids, instruction text, image count, step) of a request.

        Keys are the token ids with each image's tokens replaced by its negative image key
        (what the prefix cache hashes); ids have ``<|image_pad|>`` there (what vLLM returns).
        """
        encode = self.tokenizer.encode
        keys: list[int] = []
        ids: list[int] = []
        pad = [IMAGE_PAD_ID] * self.image_tokens
        instruction: str | None = None
        n_images = 0
        step = 0
        for msg in messages:
            if not isinstance(msg, dict):
                raise _Reject(400, "each message must be an object", param="messages")
            role = msg.get("role")
            if role == "assistant":
                step += 1
            text_ids = encode(f"<|im_start|>{role}\n")
            keys.extend(text_ids)
            ids.extend(text_ids)
            content = msg.get("content")
            texts: list[str] = []
            if isinstance(content, str):
                texts.append(content)
                text_ids = encode(content)
                keys.extend(text_ids)
                ids.extend(text_ids)
            elif isinstance(content, list):
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind == "text":
                        texts.append(part.get("text") or "")
                        text_ids = encode(part.get("text") or "")
                        keys.extend(text_ids)
                        ids.extend(text_ids)
                    elif kind == "image_url":
                        url = (part.get("image_url") or {}).get("url")
                        if not isinstance(url, str):
                            raise _Reject(400, "image_url.url must be a string", param="messages")
                        n_images += 1
                        keys.extend([-1 - image_key(url)] * self.image_tokens)
                        ids.extend(pad)
            if role == "user" and instruction is None:
                instruction = "\n".join(texts)
        return keys, ids, instruction or "", n_images, step

    def _cache_keys(self, served: str, model: Any, salt: str | None) -> tuple[Any, Any]:
        """(namespace, tag) of a request in the prefix cache (:class:`PrefixCache`): vLLM
        keys an adapter by its name and path and the request's ``cache_salt``; the ``sglang``
        flavor an adapter by its load (assumed). The tag is the load that put the answering weights in."""
        if served in self.adapters and served != self.weights:
            generation = self._adapter_generation.get(served, 0)
            if self.flavor == "sglang":
                lora: Any = ("lora", served, generation)
            else:
                lora = ("lora", served, self.adapters[served])
            return (lora, salt), ("lora", served, generation)
        return (None if salt is None else (None, salt)), ("weights", self._weights_generation)

    def _script_step(
        self, instruction: str, step: int, seed: int | None = None
    ) -> tuple[str, str | None]:
        tasks = self.script["tasks"]
        steps = None
        best = -1
        for key, value in tasks.items():
            if len(key) > best and key in instruction:
                steps, best = value, len(key)
        if steps is None:
            steps = self.script["default"]
        if steps is None:
            steps = self._defaults.get(instruction)
            if steps is None:
                if len(self._defaults) > 10_000:
                    self._defaults.clear()
                steps = self._defaults[instruction] = default_responses(instruction)
        entry = steps[min(step, len(steps) - 1)]
        if isinstance(entry, dict) and "sample" in entry:
            options = entry["sample"]
            if seed is None and self.sample_order == "cycle":
                turn = (id(steps), min(step, len(steps) - 1))
                entry = options[self._sample_turns[turn] % len(options)]
                self._sample_turns[turn] += 1
            else:
                rng = self._sample_rng if seed is None else random.Random(seed)
                entry = rng.choice(options)
        if isinstance(entry, str):
            return entry, None
        return entry.get("content", ""), entry.get("reasoning")

    def _body(
        self,
        req: dict[str, Any],
        prompt_ids: list[int],
        content: str,
        reasoning: str | None,
        tokens: list[str],
        ids: list[int],
        finish: str,
        cached: int,
        seq: int = 0,
    ) -> dict[str, Any]:
        fl = self._flavor
        faults = self.faults
        want_ids = bool(req.get("return_token_ids"))
        as_id_strings = fl.token_id_strings and bool(req.get("return_tokens_as_token_ids"))
        logprob = self.tokenizer.logprob

        logprobs = None
        if req.get("logprobs") and not faults.no_logprobs:
            entries = []
            for i, (tok, tid) in enumerate(zip(tokens, ids, strict=True)):
                entries.append(
                    {
                        "token": f"token_id:{tid}" if as_id_strings else tok,
                        "logprob": logprob(tid, i),
                        "bytes": list(tok.encode()),
                        "top_logprobs": [],
                    }
                )
            if faults.sentinel_every and seq % faults.sentinel_every == 0 and entries:
                entries[0]["logprob"] = -9999.0  # vLLM's clamp of -inf
            if faults.mismatch_every and seq % faults.mismatch_every == 0:
                # reasoning tokens counted in logprobs but not in token_ids
                for _ in range(faults.extra_logprobs):
                    entries.append(
                        {"token": "▁", "logprob": -0.5, "bytes": [32], "top_logprobs": []}
                    )
            logprobs = {"content": entries}

        message: dict[str, Any] = {"role": "assistant", "content": content}
        if fl.reasoning_key:
            message[fl.reasoning_key] = reasoning
            message["tool_calls"] = []
        else:
            message["refusal"] = None
            message["annotations"] = []
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        if want_ids and fl.ids is not None:
            if fl.ids == "choice":
                choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = None if faults.token_ids_null else ids
        elif fl.ids == "top":
            choice["token_ids"] = None  # vLLM serializes the unset field as null

        usage: dict[str, Any] = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(ids) + faults.completion_tokens_offset,
            "total_tokens": len(prompt_ids) + len(ids) + faults.completion_tokens_offset,
        }
        if not faults.cache_report:
            usage["prompt_tokens_details"] = None
        elif fl.cached_always:
            usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        elif cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        else:
            usage["prompt_tokens_details"] = None

        body: dict[str, Any] = {
            "id": f"chatcmpl-scripted-{self.request_count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
            "system_fingerprint": "legato-scripted-not-a-model",
        }
        if fl.ids == "top":
            body["prompt_token_ids"] = prompt_ids if want_ids else None
        if fl.sglext and (req.get("return_output_ids") or req.get("return_input_ids")):
            ext: dict[str, Any] = {}
            if req.get("return_output_ids"):
                ext["output_ids"] = ids
            if req.get("return_input_ids"):
                ext["input_ids"] = prompt_ids
            body["sglext"] = ext
        return body


_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _reasoning_parser(text: str) -> tuple[str | None, str | None]:
    """(content, reasoning) as vLLM's / SGLang's Qwen3 reasoning parser splits an output:
    before ``</think>`` is reasoning (a leading ``<think>`` dropped), after it content (``None``
    when empty); without ``</think>`` the whole output is reasoning and content is ``None``."""
    head, sep, tail = text.partition("</think>")
    reasoning = head.removeprefix("<think>").strip("\n")
    if not sep:
        return None, reasoning
    content = tail.lstrip("\n")
    return (content or None), reasoning


def _tool_call_parser(content: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) as vLLM's hermes tool parser splits a text: every
    ``<tool_call>{json}</tool_call>`` block becomes an OpenAI ``tool_calls`` entry (its
    ``arguments`` a JSON string), the content is the text before the first block (``None``
    when empty). A block that is not JSON leaves the text as it was."""
    calls = []
    for i, match in enumerate(_TOOL_CALL_RE.finditer(content)):
        try:
            call = orjson.loads(match.group(1))
        except orjson.JSONDecodeError:
            return content, []
        if not isinstance(call, dict):
            return content, []
        calls.append(
            {
                "id": f"chatcmpl-tool-{i}",
                "type": "function",
                "function": {
                    "name": call.get("name"),
                    "arguments": orjson.dumps(call.get("arguments")).decode(),
                },
            }
        )
    if not calls:
        return content, []
    head = content[: content.index("<tool_call>")]
    return (head or None), calls
