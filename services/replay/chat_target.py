"""`--api chat`: OpenAI `/v1/chat/completions`, the prompt as a text chat (chat_text.py).

The same content as `--api anthropic` sends (tools as one function tool, a system message, the
user messages), with the conversation in the `X-Conversation-Id` header: the reference that
the Messages path, which sends no header, must match. No `user` field: on the Messages path
nothing names a tenant either, and a tenant would keep equal prefixes apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .chat_text import ChatText, chat_text
from .http_target import CONVERSATION_HEADER, HttpTarget, openai_generation
from .prompt_layout import PromptLayout
from .records import Generation


class OpenAIChatTarget(HttpTarget):
    """Streams chat completions from an OpenAI-compatible server."""

    def request_body(self, chat: ChatText, max_tokens: int) -> dict[str, Any]:
        messages = [{"role": "system", "content": chat.system}] if chat.system else []
        messages += [{"role": "user", "content": text} for text in chat.messages]
        tools = {"tools": [chat.tool_function()]} if chat.tools else {}
        return {
            **tools,
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),  # token positions: the server renders its own
        layout: PromptLayout | None = None,
    ) -> Generation:
        """Stream one chat completion and time its chunks."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        body = self.request_body(chat_text(tokens, layout), max_tokens)
        headers = {CONVERSATION_HEADER: conversation_id}
        token_times: list[float] = []
        usage: dict[str, Any] | None = None
        served: dict[str, str] = {}
        async for chunk in self.stream_events("/v1/chat/completions", body, headers, served):
            choices = chunk.get("choices") or []
            if any((c.get("delta") or {}).get("content") for c in choices):
                token_times.append(self.clock.now())
            if chunk.get("usage"):
                usage = chunk["usage"]
        finish = self.clock.now()
        return openai_generation(usage, len(tokens), token_times, finish, served.get("rank"))
