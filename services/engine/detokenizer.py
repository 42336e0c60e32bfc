"""Streamed text: each sample's new text, holding back bytes of an unfinished character."""

from __future__ import annotations

from .tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class StreamDetokenizer:
    """Turns each sample's token stream into text pieces whose concatenation is the whole text.

    Decoding the whole output each time and emitting the new suffix keeps multi-byte characters
    split across tokens intact; a trailing replacement character waits for the next token.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: dict[int, list[int]] = {}
        self._sent: dict[int, int] = {}

    def piece(self, sample_index: int, token_ids: tuple[int, ...], finished: bool) -> str:
        """The text to send for these new tokens of one sample."""
        ids = self._ids.setdefault(sample_index, [])
        ids.extend(token_ids)
        text = self._tokenizer.decode(ids)
        if not finished:
            text = text.rstrip(REPLACEMENT)
        sent = self._sent.get(sample_index, 0)
        if len(text) <= sent:
            return ""
        self._sent[sample_index] = len(text)
        return text[sent:]
