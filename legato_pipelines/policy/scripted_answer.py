"""The chat answer of the scripted policy server (:mod:`.scripted`): a request's prompt (token
ids, images, the task's instruction and step), the script's response for it, and the body in
the flavor's wire format (token ids, logprobs, reasoning and tool-call parsing, prefix-cache
accounting, the answer-shaping faults).
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import orjson

from .scripted_config import OPENAI_FIELDS, Reject, RequestLog
from .synthetic import IMAGE_PAD_ID, default_responses, image_key


class ChatAnswers:
    """How a :class:`~.scripted.ScriptedPolicyServer` answers one chat request (a mixin: the
    server holds the flavor, script, faults, tokenizer, prefix cache and loaded weights)."""

    def _answer(self, raw: bytes, entry: RequestLog) -> bytes:
        """The chat completion body for a request, or raise :class:`Reject`."""
        fl = self._flavor
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Reject(400, f"request body is not JSON: {exc}") from None
        if not isinstance(req, dict):
            raise Reject(400, "request body must be a JSON object")
        entry.fields = tuple(req)
        if fl.strict_fields or self.faults.reject_unknown_fields:
            for name in req:
                if name not in OPENAI_FIELDS:
                    raise Reject(
                        400,
                        f"Unrecognized request argument supplied: {name}",
                        kind="invalid_request_error",
                    )
        model = req.get("model")
        served = self._served(model, req)
        if served is None:
            raise Reject(
                404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model"
            )
        entry.served = served
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Reject(400, "messages must be a non-empty list", param="messages")
        if req.get("stream"):
            raise Reject(
                400, "the scripted policy server does not stream (set stream=false)", param="stream"
            )
        if req.get("n", 1) != 1:
            raise Reject(400, "the scripted policy server answers n=1 only", param="n")

        seed, salt = req.get("seed"), req.get("cache_salt")
        entry.seed = seed if isinstance(seed, int) else None
        entry.cache_salt = salt if isinstance(salt, str) else None
        if salt is not None and (not isinstance(salt, str) or not salt):
            # vLLM's protocol check of the field
            raise Reject(400, "Parameter 'cache_salt' must be a non-empty string if provided.")
        reject = self.faults.reject_text
        if reject and reject.encode() in raw:
            raise Reject(
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
            raise Reject(400, msg, param="image")

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
            raise Reject(400, msg, param="messages")
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
                raise Reject(400, "each message must be an object", param="messages")
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
                            raise Reject(400, "image_url.url must be a string", param="messages")
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
