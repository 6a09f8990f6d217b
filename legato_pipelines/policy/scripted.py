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

Loading checkpoints: :mod:`.scripted_loading` lists the routes each flavor serves
(:mod:`legato_pipelines.policy.loading` is the client side). The chat answer is
:mod:`.scripted_answer`; faults, latency, the script and the request log :mod:`.scripted_config`.

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
import os
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .scripted_answer import ChatAnswers
from .scripted_config import (
    FLAVOR_FORMATS,
    FLAVORS,
    NOT_A_MODEL,
    OPENAI_FIELDS,
    Faults,
    Latency,
    Reject,
    RequestLog,
    load_script,
)
from .scripted_loading import RUNTIME_LORA_ENV, LoadingRoutes
from .synthetic import PrefixCache, SyntheticTokenizer

__all__ = [
    "FLAVORS",
    "NOT_A_MODEL",
    "OPENAI_FIELDS",
    "RUNTIME_LORA_ENV",
    "Faults",
    "Latency",
    "RequestLog",
    "ScriptedPolicyServer",
    "load_script",
]

log = logging.getLogger(__name__)


class ScriptedPolicyServer(ChatAnswers, LoadingRoutes):
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
        if flavor not in FLAVOR_FORMATS:
            raise ValueError(
                f"flavor must be one of {', '.join(FLAVORS)}, got {flavor!r} (fix: --flavor)"
            )
        self.flavor = flavor
        self._flavor = FLAVOR_FORMATS[flavor]
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
        elif flavor == "sglang":
            routes.append(Route("/get_server_info", self._sglang_server_info, methods=["GET"]))
        routes += self._loading_routes()
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
            Reject(401, f"Incorrect API key provided: {given}.", kind="invalid_request_error")
        )

    def _error(self, rej: Reject) -> Response:
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
        except Reject as rej:
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
                Reject(
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
