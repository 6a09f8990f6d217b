"""The normalized result of one model call, whatever server answered it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class PolicyResponse:
    """One chat completion, normalized across vLLM, SGLang, older vLLM and hosted OpenAI.

    Fields:
      content, reasoning   the message text and its reasoning (``reasoning`` or
                           ``reasoning_content``), ``None`` when absent
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
                           (evidence of which weights answered; ``None``: none sent, as vLLM
                           and SGLang today)
      notes                facts worth keeping: ``token_ids_dropped`` (server refused the field),
                           ``token_ids_ignored`` (asked, none came back), ``length_mismatch``,
                           ``logprob_sentinels: N`` (sentinel logprobs, stored as ``None``)...
    """

    content: str | None = None
    reasoning: str | None = None
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
        """The step's ``response`` object in ``rollouts.jsonl``."""
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "tokens": self.tokens,
            "finish_reason": self.finish_reason,
        }

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
