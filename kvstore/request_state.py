"""The manager's private record of one request (only the manager writes it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .hashing import SequenceHashes
from .results import PrefixMatch, RequestProgress


@dataclass
class RequestState:
    """Page tables and progress of one request, per life cycle where it differs.

    `next_commit[lc]`: blocks below it were considered for commit. `next_release[lc]`: blocks
    below it slid out (released) unless in `keep[lc]`; at context end the kept ones below it
    are released and `keep[lc]` is emptied, so each block is looked at once.
    """

    request_id: str
    conversation_id: str | None
    prompt_len: int
    sequence: SequenceHashes
    admitted: bool = False
    context_done: bool = False
    num_reused_tokens: int = 0
    num_computed_tokens: int = 0
    checkpoint_tokens: int | None = None
    branch_hints: tuple[int, ...] = ()
    branch_tokens: tuple[int, ...] = ()
    page_tables: dict[str, list[int]] = field(default_factory=dict)
    next_commit: dict[str, int] = field(default_factory=dict)
    next_release: dict[str, int] = field(default_factory=dict)
    commit_blocks: dict[str, frozenset[int]] = field(default_factory=dict)
    keep: dict[str, frozenset[int]] = field(default_factory=dict)
    contents_known: int = 0  # blocks whose contents the tiers were given (disk file checks)
    # The last match and what it was read from (`KVCacheManager.match`): still current while
    # the indexes it read are unchanged.
    last_match: tuple[tuple[int, ...], PrefixMatch] | None = None

    @classmethod
    def for_prompt(
        cls,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        conversation_id: str | None,
        extra_key: bytes,
        block_size: int,
    ) -> RequestState:
        """A new request with its prompt's full blocks hashed; ValueError for an empty prompt."""
        sequence = SequenceHashes(block_size, extra_key)
        sequence.extend(prompt_token_ids)
        return cls.for_sequence(request_id, sequence, conversation_id)

    @classmethod
    def for_sequence(
        cls, request_id: str, sequence: SequenceHashes, conversation_id: str | None
    ) -> RequestState:
        """A new request whose prompt is `sequence` (hashed already); ValueError if empty."""
        if sequence.num_tokens == 0:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        return cls(request_id, conversation_id, sequence.num_tokens, sequence)

    def progress(self) -> RequestProgress:
        """Where the request stands (a frozen copy)."""
        return RequestProgress(
            self.admitted,
            self.num_reused_tokens,
            self.num_computed_tokens,
            self.checkpoint_tokens,
            self.context_done,
            self.branch_tokens,
        )

    def check_commit(self, num_computed_tokens: int, block_size: int) -> None:
        """Raise ValueError unless the request is admitted and `num_computed_tokens` goes from
        its computed tokens up to the end of its pages."""
        limit = len(next(iter(self.page_tables.values()), [])) * block_size
        if not self.admitted or not self.num_computed_tokens <= num_computed_tokens <= limit:
            raise ValueError(
                f"request {self.request_id!r}: computed tokens must go from "
                f"{self.num_computed_tokens} up to {limit} (with pages), got {num_computed_tokens}"
            )

    def check_context_end(self) -> None:
        """Raise ValueError unless the whole prompt is computed and the context not ended yet."""
        if self.context_done or self.num_computed_tokens < self.prompt_len:
            raise ValueError(
                f"request {self.request_id!r}: context end needs {self.prompt_len} computed "
                f"tokens, has {self.num_computed_tokens} (done already: {self.context_done})"
            )
