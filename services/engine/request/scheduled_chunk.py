"""One sequence's share of a step: what the scheduler plans and a compute backend runs.

It lives below both (the backends import it, never the scheduler).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .sequence import Sequence


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's share of a step: tokens [start, start + len(new_tokens)) and its pages."""

    sequence: Sequence
    start: int
    new_tokens: tuple[int, ...]
    page_ids: Mapping[str, tuple[int, ...]]

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the last known token, so its logits give the next one."""
        return self.start + len(self.new_tokens) == self.sequence.num_tokens

    @property
    def count(self) -> int:
        """Tokens this chunk computes."""
        return len(self.new_tokens)
