"""`--api anthropic`: the Anthropic Messages API (`/v1/messages`), sent as Claude Code sends it.

The prompt is the text chat of chat_text.py. Claude Code's `cache_control` breakpoints: the
end of the tools, the end of the system prompt and the last message's last block. No
conversation header: the server finds the conversation as it does for Claude Code, from the
session part of `metadata.user_id` (`user_<hash>_account_<uuid>_session_<uuid>`, what Claude
Code writes; `--anthropic-session metadata`, the default) or, with `--anthropic-session
prefix`, from nothing but the prompt's opening (tools, system, first user message).

Reuse is `usage.cache_read_input_tokens` of the final `message_delta`; the prompt is the sum of
the three input counts. The Messages API has no `ignore_eos`, so a model may stop before
`max_tokens`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

from .chat_text import EMPTY_SCHEMA, TOOL_NAME, ChatText, chat_text
from .http_target import HttpTarget
from .prompt_layout import PromptLayout
from .records import Generation
from .target_types import TargetError

SESSION_SOURCES = ("metadata", "prefix")
ANTHROPIC_VERSION = "2023-06-01"
BREAKPOINT = {"type": "ephemeral"}
# One replay is one account: the session part is what tells conversations apart.
_ACCOUNT = uuid.uuid5(uuid.NAMESPACE_URL, "kvfleet-replay")


def claude_code_user_id(conversation_id: str) -> str:
    """A `metadata.user_id` in Claude Code's shape whose session is this conversation's."""
    session = uuid.uuid5(uuid.NAMESPACE_URL, f"kvfleet-replay/{conversation_id}")
    user = hashlib.sha256(b"kvfleet-replay").hexdigest()
    return f"user_{user}_account_{_ACCOUNT}_session_{session}"


class AnthropicMessagesTarget(HttpTarget):
    """Streams messages from a server with the Anthropic Messages API."""

    def __init__(self, base_url: str, *, session: str = "metadata", **options: Any) -> None:
        if session not in SESSION_SOURCES:
            raise ValueError(f"session={session!r} not in {SESSION_SOURCES}")
        super().__init__(base_url, **options)
        self.session = session

    def request_body(self, chat: ChatText, conversation_id: str, max_tokens: int) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": text}]}
                for text in chat.messages
            ],
        }
        body["messages"][-1]["content"][-1]["cache_control"] = BREAKPOINT
        if chat.tools:
            tool = {"name": TOOL_NAME, "description": chat.tools, "input_schema": EMPTY_SCHEMA}
            body["tools"] = [tool | {"cache_control": BREAKPOINT}]
        if chat.system:
            body["system"] = [{"type": "text", "text": chat.system, "cache_control": BREAKPOINT}]
        if self.session == "metadata":
            body["metadata"] = {"user_id": claude_code_user_id(conversation_id)}
        return body

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),  # the breakpoints say where: the server places them
        layout: PromptLayout | None = None,
    ) -> Generation:
        """Stream one message and time its text deltas."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        body = self.request_body(chat_text(tokens, layout), conversation_id, max_tokens)
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        token_times: list[float] = []
        usage: dict[str, Any] | None = None
        served: dict[str, str] = {}
        async for chunk in self.stream_events("/v1/messages", body, headers, served):
            kind = chunk.get("type")
            if kind == "content_block_delta":
                token_times.append(self.clock.now())
            elif kind == "message_delta":
                usage = chunk.get("usage")
            elif kind == "error":
                raise TargetError(f"/v1/messages stream error: {chunk.get('error')}")
        return _generation(usage, token_times, self.clock.now(), served.get("rank"))


def _generation(
    usage: dict[str, Any] | None, token_times: list[float], finish: float, rank: str | None
) -> Generation:
    if usage is None:
        raise TargetError("stream ended without message_delta usage")
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    prompt_tokens = int(usage.get("input_tokens") or 0) + read + written
    return Generation(
        prompt_tokens=prompt_tokens,
        cached_tokens=min(read, prompt_tokens),
        output_tokens=int(usage.get("output_tokens") or len(token_times)),
        first_token_s=token_times[0] if token_times else None,
        token_times_s=tuple(token_times),
        finish_s=finish,
        rank=rank,
    )
