"""Streamed text: each sample's new text, holding back bytes of an unfinished character."""

from __future__ import annotations

from ..model.tokenizer import Tokenizer

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


def first_stop(text: str, stops: tuple[str, ...]) -> int:
    """Index of the earliest stop string in `text`, -1 when none occurs."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits, default=-1)


class StopText:
    """Per sample: streamed text held back while it may still begin a stop string, cut at one.

    Text is released once no stop string can start in it, so a client never sees the start of
    a stop string that then completes; at the stop the text ends (the stop itself is not sent).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._held: dict[int, str] = {}
        self.stopped: set[int] = set()

    def feed(self, sample_index: int, text: str, finished: bool) -> str:
        """What to send of `text`, the sample's next piece."""
        if sample_index in self.stopped:
            return ""
        pending = self._held.pop(sample_index, "") + text
        hit = first_stop(pending, self.stops)
        if hit >= 0:
            self.stopped.add(sample_index)
            return pending[:hit]
        if finished or not self.stops:
            return pending
        hold = max((k for s in self.stops for k in range(1, len(s)) if pending.endswith(s[:k])),
                   default=0)  # fmt: skip
        if hold:
            self._held[sample_index] = pending[-hold:]
            return pending[:-hold]
        return pending


class StopChecker:
    """Whether a sample's output so far ends in one of the stop strings (the engine's check).

    Decodes only the tail that can hold the longest stop string (a character is at most four
    tokens), so each generated token costs a short decode.
    """

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stops = stops
        self._tail = 4 * max(len(s) for s in stops) + 4

    def hit(self, output: list[int]) -> bool:
        text = self._tokenizer.decode(output[-self._tail :])
        return first_stop(text, self._stops) >= 0
