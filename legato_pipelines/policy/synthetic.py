"""Synthetic model internals for the scripted policy server: NOT a model.

* :class:`SyntheticTokenizer`: splits text into token strings that join back to the text
  exactly, with deterministic ids (CRC-32 mod a Qwen-sized vocabulary) and deterministic
  negative logprobs.
* :func:`image_key`: a cheap fingerprint of an image data URL (no base64 decoding).
* :class:`PrefixCache`: vLLM-style block-hash prefix caching (16-token blocks, chained hashes,
  image identity inside the hash as in vLLM PR #11187), bounded memory.
* :func:`default_responses`: deterministic plausible Qwen computer-use responses for an
  instruction: a few actions, then ``terminate`` with status success.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import zlib
from array import array
from itertools import islice
from typing import Any

VOCAB_SIZE = 151_643  # Qwen2.5 text vocabulary size
IMAGE_PAD_ID = 151_655  # Qwen2.5-VL <|image_pad|>
_TOKEN_RE = re.compile(r"\s*(?:\w{1,8}|[^\w\s])|\s+")


class SyntheticTokenizer:
    """Deterministic stand-in tokenizer (whitespace-led word pieces of <= 8 chars, punctuation).

    ``tokenize(text)`` joins back to ``text`` exactly; ``token_id`` is ``crc32(token) %
    VOCAB_SIZE``; ``logprob(id, position)`` is in (-4, 0). Token ids and whole encoded texts
    are memoized (bounded): prompts repeat their system text and history every step.
    """

    def __init__(self, cache_size: int = 200_000, text_cache_size: int = 20_000):
        self._ids: dict[str, int] = {}
        self._texts: dict[str, list[int]] = {}
        self._cache_size = cache_size
        self._text_cache_size = text_cache_size

    @staticmethod
    def tokenize(text: str) -> list[str]:
        return _TOKEN_RE.findall(text)

    def token_id(self, token: str) -> int:
        tid = self._ids.get(token)
        if tid is None:
            tid = zlib.crc32(token.encode()) % VOCAB_SIZE
            if len(self._ids) >= self._cache_size:
                self._ids.clear()
            self._ids[token] = tid
        return tid

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (a shared cached list: do not mutate)."""
        ids = self._texts.get(text)
        if ids is None:
            token_id = self.token_id
            ids = [token_id(t) for t in _TOKEN_RE.findall(text)]
            if len(self._texts) >= self._text_cache_size:
                self._texts.clear()
            self._texts[text] = ids
        return ids

    @staticmethod
    def logprob(token_id: int, position: int) -> float:
        return -((token_id * 2654435761 + position * 40503) % 4000 + 1) / 1000.0


def image_key(url: str) -> int:
    """A 62-bit key of an image URL without decoding it.

    Data URLs longer than 4 KiB are fingerprinted from their length, first and last 512
    characters and 512 characters sampled at an even stride: a PNG's tail holds the CRC-32 of
    its last IDAT chunk, so two different screenshots differ there. O(1) per image.
    """
    n = len(url)
    if n > 4096:
        url = f"{n}|{url[:512]}|{url[-512:]}|{url[512 : n - 512 : (n - 1024) // 512 or 1]}"
    return int.from_bytes(hashlib.blake2b(url.encode(), digest_size=8).digest(), "big") >> 2


class PrefixCache:
    """Cached-token accounting as vLLM's prefix cache does it (block hashes), bounded.

    A prompt is a list of keys (token ids >= 0; image tokens as negative image keys so two
    images never share a block). Full blocks of ``block_size`` keys are hashed in a chain;
    :meth:`lookup_and_insert` returns how many leading tokens were seen before (whole blocks,
    never the whole prompt: the last token is always computed) and remembers all blocks. At
    most ``capacity`` block hashes are kept; the oldest tenth is evicted when full.

    ``namespace`` starts the chain (vLLM hashes a LoRA adapter's name and path and the
    request's ``cache_salt`` into its first block: requests share blocks only within one
    namespace); ``tag`` names the weights that computed the blocks inserted now, and
    :attr:`last_stale` is how many of the tokens the last lookup found cached were computed by
    weights of another tag (KV of old weights served to new ones).
    """

    def __init__(self, block_size: int = 16, capacity: int = 1_000_000):
        self.block_size = block_size
        self.capacity = capacity
        self._seen: dict[int, Any] = {}
        self.last_stale = 0

    def lookup_and_insert(self, keys: list[int], namespace: Any = None, tag: Any = None) -> int:
        bs = self.block_size
        seen = self._seen
        h = 0 if namespace is None else hash(("namespace", namespace))
        cached = stale = 0
        hitting = True
        data = array("q", keys).tobytes()  # int64: token ids and negative image keys
        width = bs * 8
        for start in range(0, len(data) - width + 1, width):
            h = hash((h, data[start : start + width]))
            if hitting and h in seen:
                cached += bs
                if seen[h] != tag:
                    stale += bs
            else:
                hitting = False
                seen[h] = tag
        if cached >= len(keys) and cached:
            cached -= bs
            stale = min(stale, cached)
        if len(seen) > self.capacity:
            for old in list(islice(iter(seen), len(seen) // 10 or 1)):
                del seen[old]
        self.last_stale = stale
        return cached

    def clear(self) -> None:
        self._seen.clear()


def qwen_response(description: str, arguments: dict) -> str:
    """A response in the Qwen computer-use format (OSWorld ``mm_agents``)."""
    call = json.dumps({"name": "computer_use", "arguments": arguments}, ensure_ascii=False)
    return f"Action: {description}\n<tool_call>\n{call}\n</tool_call>"


_WORDS = ("report", "budget", "hello world", "notes", "2024", "summary", "Alice", "total")
_KEYS = (["ctrl", "s"], ["Return"], ["ctrl", "a"], ["tab"], ["ctrl", "c"], ["escape"])


def default_responses(instruction: str) -> list[str]:
    """Deterministic responses for an instruction: N-1 plausible actions then ``terminate``.

    N is in 2..6, seeded by CRC-32 of the instruction; actions are ``left_click`` (model
    coordinates 0-999), ``type`` and ``key``.
    """
    seed = zlib.crc32(instruction.encode())
    rng = random.Random(seed)
    n = 2 + seed % 5
    out = []
    for _ in range(n - 1):
        kind = rng.choice(("left_click", "left_click", "type", "key"))
        if kind == "left_click":
            x, y = rng.randrange(1000), rng.randrange(1000)
            out.append(
                qwen_response(
                    f"Click the element at ({x}, {y}).",
                    {"action": "left_click", "coordinate": [x, y]},
                )
            )
        elif kind == "type":
            text = rng.choice(_WORDS)
            out.append(qwen_response(f"Type {text!r}.", {"action": "type", "text": text}))
        else:
            keys = rng.choice(_KEYS)
            out.append(qwen_response(f"Press {'+'.join(keys)}.", {"action": "key", "keys": keys}))
    out.append(qwen_response("The task is done.", {"action": "terminate", "status": "success"}))
    return out
