"""The normalized result of one model call, whatever server answered it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CONTEXT_LENGTH = "context_length"
"""A cut output's kind (:meth:`PolicyResponse.cut`): the server shortened it to fit its context."""
MAX_TOKENS = "max_tokens"
"""A cut output's kind (:meth:`PolicyResponse.cut`): it reached ``max_tokens``."""


@dataclass(slots=True)
class PolicyResponse:
    """One chat completion, normalized across vLLM, SGLang, older vLLM and hosted OpenAI.

    Fields:
      content, reasoning   the message text and its reasoning (``reasoning`` or
                           ``reasoning_content``), ``None`` when absent
      tool_calls           the message's ``tool_calls`` as the server sent them (a server
                           started with a tool-call parser: vLLM ``--tool-call-parser``, SGLang
                           ``--tool-call-parser``), ``None`` when absent or empty
      token_ids            completion token ids, or ``None`` when the server gave none
      logprobs             one float per completion token, or ``None``
      tokens               token strings, only when there are no ids (hosted APIs)
      finish_reason        ``stop`` | ``length`` | ``tool_calls`` | ...
      prompt_tokens, completion_tokens   [tokens] from ``usage``
      cached_tokens        [tokens] ``usage.prompt_tokens_details.cached_tokens``; ``None`` when
                           the server did not report it (unknown, not 0)
      token_ids_source     where ids came from: ``choice.token_ids`` | ``sglext.output_ids`` |
                           ``logprobs.token_id_strings`` | ``None``
      prompt_token_ids     prompt ids when the server returned them (stored per step as
                           ``Step.prompt_ids``, exported as ``prompt_token_ids``)
      reasoning_field      which message field carried reasoning: ``reasoning`` (vLLM >= 0.11),
                           ``reasoning_content`` (SGLang, older vLLM) or ``None`` (not stored)
      seconds              wall time of the call including re-tries
      attempts             HTTP requests made (1 + re-tries used)
      timeouts             how many of those hit ``step_timeout``
      system_fingerprint   the response's ``system_fingerprint`` when the server sent one
                           (kept as a fact, proves nothing about weights: vLLM 0.32 sends a
                           hash of its server config, the same for the base model and every
                           adapter; docs/wire-formats.md §1, §6)
      notes                facts worth keeping: ``token_ids_dropped`` (server refused the field),
                           ``token_ids_ignored`` (asked, none came back), ``length_mismatch``,
                           ``logprob_sentinels: N`` (sentinel logprobs, stored as ``None``)...
    """

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokens: list[str] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    token_ids_source: str | None = None
    prompt_token_ids: list[int] | None = None
    reasoning_field: str | None = None
    seconds: float = 0.0
    attempts: int = 1
    timeouts: int = 0
    notes: list[str] = field(default_factory=list)
    system_fingerprint: str | None = None

    def response_record(self) -> dict[str, Any]:
        """The step's ``response`` object in ``rollouts.jsonl`` (``tool_calls`` only when the
        server sent some)."""
        out = {
            "content": self.content,
            "reasoning": self.reasoning,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "tokens": self.tokens,
            "finish_reason": self.finish_reason,
        }
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out

    def answer(self) -> tuple[str | None, str | None]:
        """(the text that holds the model's answer, the field it came from): where a server's
        parsers put the action (issue 31). ``content``, with every ``tool_calls`` entry written
        back as the ``<tool_call>{"name", "arguments"}</tool_call>`` block the model generated
        (Qwen's format; field ``tool_calls`` when there is no other content, else
        ``content+tool_calls``); when there is neither, the reasoning (a reasoning parser puts
        the whole answer, tool call included, in ``reasoning`` / ``reasoning_content`` when the
        model closes no ``</think>``; field ``reasoning``). ``(None, None)`` when the answer is
        empty everywhere. The token ids are the server's either way: only the text read for the
        action differs."""
        content = self.content if (self.content or "").strip() else None
        calls = [_tool_call_text(call) for call in self.tool_calls or ()]
        if calls:
            text = "\n".join(calls)
            if content is None:
                return text, "tool_calls"
            return f"{content.rstrip()}\n{text}", "content+tool_calls"
        if content is not None:
            return self.content, "content"
        if (self.reasoning or "").strip():
            return self.reasoning, "reasoning"
        return self.content, None

    def cut(self, max_tokens: int) -> str | None:
        """Why the output was cut, or ``None`` when it was not (``finish_reason`` is not
        ``length``): :data:`CONTEXT_LENGTH` when fewer than ``max_tokens`` tokens came (vLLM
        >= 0.32 shortens an output whose prompt + ``max_tokens`` exceed the context instead of
        answering 400), else :data:`MAX_TOKENS`."""
        if self.finish_reason != "length":
            return None
        n = self.completion_tokens
        if n is None and self.token_ids is not None:
            n = len(self.token_ids)
        return CONTEXT_LENGTH if n is not None and n < max_tokens else MAX_TOKENS

    def model_record(self) -> dict[str, Any]:
        """The step's ``model`` stats object in ``rollouts.jsonl`` (``system_fingerprint``
        only when the server sent one)."""
        out = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "seconds": round(self.seconds, 6),
            "attempts": self.attempts,
            "timeouts": self.timeouts,
            "token_ids_source": self.token_ids_source,
            "notes": self.notes,
        }
        if self.system_fingerprint is not None:
            out["system_fingerprint"] = self.system_fingerprint
        return out


def _tool_call_text(call: Any) -> str:
    """One OpenAI ``tool_calls`` entry as the Qwen ``<tool_call>`` block it was parsed from
    (``arguments`` is a JSON string on the wire: decoded when it is JSON, else kept as is so
    that the harness reports it unreadable)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"
