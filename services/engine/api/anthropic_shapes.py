"""Anthropic response shapes: the message, its usage, and the SSE events of a stream.

Usage (docs/api.md, "What the usage counts mean"), from the engine's counts of one request:
- `cache_read_input_tokens`: prompt tokens whose KV was reused (the engine's cached tokens);
- `cache_creation_input_tokens`: prompt tokens in whole blocks this request computed and
  committed to the prefix cache (the engine's `cache_write_tokens`);
- `input_tokens`: the rest of the prompt (its trailing partial block), so the three add up to
  the prompt; `cache_creation` splits the written tokens by TTL: those before the last `1h`
  breakpoint count as `ephemeral_1h_input_tokens`, the others as `ephemeral_5m_input_tokens`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..request.engine_request import Usage

LONG_TTL_SECONDS = 3600


def usage_body(usage: Usage | None, breakpoints: Sequence[tuple[int, int]] = ()) -> dict:
    """Anthropic `usage` from the engine's; `breakpoints`: (token position, TTL seconds)."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    read, written = usage.cached_tokens, usage.cache_write_tokens
    long_end = max((pos for pos, ttl in breakpoints if ttl >= LONG_TTL_SECONDS), default=0)
    long_written = max(0, min(read + written, long_end) - read)
    return {
        "input_tokens": max(0, usage.prompt_tokens - read - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": written - long_written,
            "ephemeral_1h_input_tokens": long_written,
        },
        "output_tokens": usage.completion_tokens,
    }


def stop_reason_of(finish_reason: str | None, stop_sequence: str | None, tool_calls: bool) -> str:
    if tool_calls:
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    if finish_reason == "length":
        return "max_tokens"
    return "end_turn"


def matched_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop sequence that occurs first in `text` (the one that ended it), else None."""
    hits = [(index, stop) for stop in stops if (index := text.find(stop)) >= 0]
    return min(hits)[1] if hits else None


def message_body(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def event(kind: str, payload: dict[str, Any]) -> str:
    """One SSE event: Anthropic names it in `event:` and repeats it in the data's `type`."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n"
