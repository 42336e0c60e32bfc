"""OpenAI response shapes of one request: completion or chat, chunk or whole, with logprobs."""

from __future__ import annotations

import json
import time
from typing import Any

from ..core.detokenizer import first_stop
from ..model.tokenizer import Tokenizer
from ..request.engine_request import SampleOutput, Usage
from ..request.sampling_params import TokenLogprob


class ResponseShape:
    """How one request's outputs look to an OpenAI client."""

    def __init__(self, request_id: str, model: str, chat: bool, tokenizer: Tokenizer):
        self.request_id, self.model, self.chat, self.tokenizer = request_id, model, chat, tokenizer
        self.created = int(time.time())

    def head(self, kind: str) -> dict[str, Any]:
        objects = {
            ("chunk", True): "chat.completion.chunk",
            ("chunk", False): "text_completion",
            ("full", True): "chat.completion",
            ("full", False): "text_completion",
        }
        return {
            "id": self.request_id,
            "object": objects[kind, self.chat],
            "created": self.created,
            "model": self.model,
        }

    def chunk(
        self,
        index: int,
        piece: Any,
        finish_reason: str | None,
        logprobs: tuple[TokenLogprob, ...] = (),
        token_ids: tuple[int, ...] | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason}
        if self.chat:
            choice["delta"] = piece
        else:
            choice["text"] = piece
        choice["logprobs"] = self.logprobs(logprobs) if logprobs else None
        if token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return {**self.head("chunk"), "choices": [choice]}

    def full(
        self,
        outputs: list[SampleOutput],
        num_samples: int,
        stops: tuple[str, ...],
        token_ids: bool = False,
    ) -> dict[str, Any]:
        tokens: dict[int, list[int]] = {i: [] for i in range(num_samples)}
        logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in range(num_samples)}
        reasons: dict[int, str | None] = dict.fromkeys(range(num_samples))
        usages: dict[int, Usage] = {}
        for output in outputs:
            tokens[output.sample_index] += output.token_ids
            logprobs[output.sample_index] += output.logprobs
            if output.finished:
                reasons[output.sample_index] = output.finish_reason
            if output.usage is not None:
                usages[output.sample_index] = output.usage
        choices = []
        for index in range(num_samples):
            text = self.tokenizer.decode(tokens[index])
            cut = first_stop(text, stops) if stops else -1
            if cut >= 0:
                text, reasons[index] = text[:cut], "stop"
            choice: dict[str, Any] = {"index": index, "finish_reason": reasons[index]}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self.logprobs(tuple(logprobs[index])) if logprobs[index] else None
            if token_ids:
                choice["token_ids"] = tokens[index]
            choices.append(choice)
        return {**self.head("full"), "choices": choices, "usage": usage_body(usages)}

    def logprobs(self, items: tuple[TokenLogprob, ...]) -> dict[str, Any]:
        """Chat: `{content: [{token, logprob, bytes, top_logprobs}]}`; completions: the
        legacy `{tokens, token_logprobs, top_logprobs}` lists."""
        if self.chat:
            return {"content": [self._chat_entry(item) for item in items]}
        return {
            "tokens": [self._text(item.token) for item in items],
            "token_logprobs": [_finite(item.logprob) for item in items],
            "top_logprobs": [self._top_by_text(item) for item in items],
        }

    def _top_by_text(self, item: TokenLogprob) -> dict[str, float]:
        """The legacy shape keys alternatives by text: of tokens with equal text, the likelier."""
        top: dict[str, float] = {}
        for token, logprob in item.top:
            top.setdefault(self._text(token), _finite(logprob))
        return top

    def _chat_entry(self, item: TokenLogprob) -> dict[str, Any]:
        entry = self._token(item.token, item.logprob)
        entry["top_logprobs"] = [self._token(t, lp) for t, lp in item.top]
        return entry

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._text(token)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    def _text(self, token: int) -> str:
        return self.tokenizer.decode([token])


def _finite(logprob: float) -> float:
    """JSON has no -Infinity: an impossible token reads as -9999 (as vLLM reports it)."""
    return max(logprob, -9999.0)


def usage_body(usages: dict[int, Usage]) -> dict[str, Any] | None:
    if not usages:
        return None
    first = usages[min(usages)]
    completion = sum(u.completion_tokens for u in usages.values())
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        # cache_write_tokens (kvfleet): prompt tokens this request wrote to the prefix cache.
        "prompt_tokens_details": {
            "cached_tokens": first.cached_tokens,
            "cache_write_tokens": first.cache_write_tokens,
        },
        "ttft_seconds": first.ttft_seconds,
        "mean_itl_seconds": first.mean_itl_seconds,
    }


def sse_event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
