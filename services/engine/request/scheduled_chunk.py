"""One sequence's share of a step: what the scheduler plans and a compute backend runs.

It lives below both (the backends import it, never the scheduler).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from .sequence import Sequence

PageIds = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's share of a step: tokens [start, start + len(new_tokens)) and its pages.

    `pages`: its page ids per life cycle, or the call that reads them from the kvstore when
    first asked (before the step's commits): a decode step through persistent device page
    tables never asks, so it never copies whole tables.
    """

    sequence: Sequence
    start: int
    new_tokens: tuple[int, ...]
    pages: PageIds | Callable[[], PageIds] = field(repr=False)

    @classmethod
    def one_token(
        cls, sequence: Sequence, start: int, token: int, pages: PageIds | Callable[[], PageIds]
    ) -> ScheduledChunk:
        """`ScheduledChunk(sequence, start, (token,), pages)`, built without the frozen
        dataclass's `object.__setattr__` per field: a decode step makes one per sequence."""
        chunk = object.__new__(cls)
        chunk.__dict__.update(sequence=sequence, start=start, new_tokens=(token,), pages=pages)
        return chunk

    @cached_property
    def page_ids(self) -> PageIds:
        return self.pages() if callable(self.pages) else self.pages

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the last known token, so its logits give the next one."""
        return self.start + len(self.new_tokens) == self.sequence.num_tokens

    @property
    def count(self) -> int:
        """Tokens this chunk computes."""
        return len(self.new_tokens)
