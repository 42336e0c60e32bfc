"""Decoding that keeps a tool-call family's marker tokens in the text.

Some checkpoints make their call markers special tokens (Mistral's `[TOOL_CALLS]` and
`[ARGS]`, Llama 3's `<|python_tag|>`); decoding for the client drops special tokens, which
would erase the very markers the parser looks for. This tokenizer decodes like the one it
wraps, except that those marker tokens come out as their text; eos and the other special
tokens are still left out.
"""

from __future__ import annotations

from typing import Any

from ..model.tokenizer import Tokenizer

FAMILY_MARKERS = {
    "llama3_json": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen3_coder": ("<tool_call>", "</tool_call>"),
}


class MarkerKeepingTokenizer:
    """`tokenizer`, but `decode` writes the tokens of `markers` (id -> text) as their text."""

    def __init__(self, tokenizer: Tokenizer, markers: dict[int, str]) -> None:
        self._tokenizer = tokenizer
        self._markers = markers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        parts: list[str] = []
        run: list[int] = []
        for token in ids:
            if token in self._markers:
                parts += [self._tokenizer.decode(run), self._markers[token]]
                run = []
            else:
                run.append(token)
        parts.append(self._tokenizer.decode(run))
        return "".join(parts)


def tool_text_tokenizer(tokenizer: Tokenizer, family: str) -> Tokenizer:
    """A tokenizer whose decode keeps `family`'s special marker tokens (itself when none of
    them is a special token of this vocabulary)."""
    special = getattr(tokenizer, "special_token_ids", None) or {}
    markers = {special[m]: m for m in FAMILY_MARKERS.get(family, ()) if m in special}
    return MarkerKeepingTokenizer(tokenizer, markers) if markers else tokenizer
