"""`--api text`: OpenAI `/v1/completions` with the prompt as ASCII text, one byte a token.

For servers and routers that take no token-id prompts (sglang-router's cache-aware policy
matches prompt text). The replay's token ids stay below 128, so each is one ASCII byte and a
byte tokenizer (kvfleet's engine without a model directory) maps the text back to the same
ids: reuse and lengths are those of the token-id replay.
"""

from __future__ import annotations

from .http_target import OpenAICompletionsTarget
from .target_types import TargetInfo

TEXT_VOCAB = 128  # ids below it are one ASCII byte each


class TextCompletionsTarget(OpenAICompletionsTarget):
    """OpenAI completions, the prompt as the ASCII text of its token ids."""

    async def describe(self) -> TargetInfo:
        """The server's figures, with the vocabulary capped at ASCII's 128 ids."""
        info = await super().describe()
        return TargetInfo(min(info.vocab_size or TEXT_VOCAB, TEXT_VOCAB), info.max_model_len)

    def prompt_of(self, tokens: list[int]) -> str:
        """The ids as ASCII text; one byte is one token, so branch hints stay text positions."""
        if tokens and max(tokens) >= TEXT_VOCAB:
            raise ValueError(
                f"token id {max(tokens)} >= {TEXT_VOCAB}: --api text needs --vocab-size <= "
                f"{TEXT_VOCAB} (one ASCII byte a token)"
            )
        return bytes(tokens).decode("ascii")
