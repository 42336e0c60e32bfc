"""The `http://HOST:PORT` target: OpenAI `/v1/completions` with streaming (`--api completions`,
the default; `--api chat` and `--api anthropic` send the same content as a text chat:
chat_target.py, messages_target.py, on the `HttpTarget` base here).

The base URL may end in `/v1` (what `kvfleet up` and most servers print) or not.

The prompt goes as a list of token ids (the API allows it). TTFT is the first streamed chunk
with a choice; reused tokens are `usage.prompt_tokens_details.cached_tokens` of the final usage
chunk (`stream_options.include_usage`). The conversation id goes in `user` and in the
`X-Conversation-Id` header, so a router can pin the conversation. `ignore_eos` and
`min_tokens` (vLLM/SGLang extensions) ask for exactly `max_tokens` tokens, and
`return_token_ids` (vLLM's; kvfleet's) streams each step's ids even while their text is held
back, so TTFT and inter-token gaps time tokens: a model whose first tokens decode to no
complete character (random weights do) would otherwise show the time to its first text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from ..engine.api.served_by import RANK_HEADER
from .prompt_layout import PromptLayout
from .records import Generation
from .target_types import TargetError, TargetInfo, WallClock

CONVERSATION_HEADER = "X-Conversation-Id"


class HttpTarget:
    """What every HTTP target shares: the connection pool, `/v1/models`, streamed posts."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "kvfleet",
        timeout_s: float = 600.0,
        max_connections: int = 256,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.clock = WallClock()
        self.model = model
        self._client = httpx.AsyncClient(
            base_url=server_root(base_url),
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_connections),
        )

    async def describe(self) -> TargetInfo:
        """`vocab_size` and `max_model_len` of this model's `/v1/models` entry (vLLM and
        kvfleet publish the context length; kvfleet also the vocabulary), where given."""
        try:
            response = await self._client.get("/v1/models")
        except httpx.HTTPError as error:
            raise TargetError(f"GET /v1/models failed: {error!r}") from error
        if response.status_code != 200:
            return TargetInfo()  # a server without the listing tells nothing
        try:
            entries = [e for e in response.json().get("data") or [] if isinstance(e, dict)]
        except (ValueError, AttributeError):
            return TargetInfo()
        entry = next((e for e in entries if e.get("id") == self.model), None)
        if entry is None:
            known = [e.get("id") for e in entries]
            raise TargetError(f"model {self.model!r} (--model) is not served here; known: {known}")
        return TargetInfo(_positive(entry.get("vocab_size")), _positive(entry.get("max_model_len")))

    async def stream_events(
        self,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        served: dict[str, str] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """POST `body` and yield the JSON payload of each server-sent event; TargetError when
        the server refuses or the connection fails. `served` gets `rank`: the rank a kvfleet
        router names in its answer's headers (absent elsewhere)."""
        try:
            async with self._client.stream("POST", path, json=body, headers=headers) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:300]
                    raise TargetError(f"HTTP {response.status_code} from {path}: {detail}")
                if served is not None and RANK_HEADER in response.headers:
                    served["rank"] = response.headers[RANK_HEADER]
                async for line in response.aiter_lines():
                    chunk = _event(line)
                    if chunk is not None:
                        yield chunk
        except httpx.HTTPError as error:
            raise TargetError(f"{path} request failed: {error!r}") from error

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()


class OpenAICompletionsTarget(HttpTarget):
    """Streams completions from an OpenAI-compatible server, the prompt as token ids."""

    def prompt_of(self, tokens: list[int]) -> list[int] | str:
        """The request's `prompt`: the token ids themselves."""
        return tokens

    def request_body(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
    ) -> dict:
        """The JSON body of one completion request."""
        hints = {"branch_hints": list(branch_hints)} if branch_hints else {}
        return {
            **hints,
            "model": self.model,
            "prompt": self.prompt_of(tokens),
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            # Every step's ids stream even while their text is held back (vLLM and kvfleet):
            # TTFT is the first token, not the first complete character.
            "return_token_ids": True,
            "user": conversation_id,
        }

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
        layout: PromptLayout | None = None,  # token ids need no layout
    ) -> Generation:
        """Stream one completion and time its chunks."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        body = self.request_body(conversation_id, tokens, max_tokens, branch_hints)
        headers = {CONVERSATION_HEADER: conversation_id}
        token_times: list[float] = []
        usage: dict[str, Any] | None = None
        served: dict[str, str] = {}
        async for chunk in self.stream_events("/v1/completions", body, headers, served):
            if chunk.get("choices"):
                token_times.append(self.clock.now())
            if chunk.get("usage"):
                usage = chunk["usage"]
        finish = self.clock.now()
        return openai_generation(usage, len(tokens), token_times, finish, served.get("rank"))


def server_root(base_url: str) -> str:
    """`http://h:p/v1` and `http://h:p/` both mean the server at `http://h:p`."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _event(line: str) -> dict[str, Any] | None:
    """The JSON payload of one server-sent-event line, or None for anything else."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        return json.loads(payload)
    except json.JSONDecodeError as error:
        raise TargetError(f"bad stream chunk {payload[:120]!r}") from error


def openai_generation(
    usage: dict[str, Any] | None,
    sent_tokens: int,
    token_times: list[float],
    finish: float,
    rank: str | None = None,
) -> Generation:
    if usage is None:
        raise TargetError("stream ended without a usage chunk (stream_options.include_usage)")
    details = usage.get("prompt_tokens_details") or {}
    prompt_tokens = int(usage.get("prompt_tokens", sent_tokens))
    cached = int(details.get("cached_tokens") or 0)
    return Generation(
        prompt_tokens=prompt_tokens,
        cached_tokens=min(cached, prompt_tokens),
        output_tokens=int(usage.get("completion_tokens", len(token_times))),
        first_token_s=token_times[0] if token_times else None,
        token_times_s=tuple(token_times),
        finish_s=finish,
        rank=rank,
    )
