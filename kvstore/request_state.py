"""The manager's private record of one request (only the manager writes it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvfleet.kvstore.hashing import SequenceHashes


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
    branch_tokens: int | None = None
    page_tables: dict[str, list[int]] = field(default_factory=dict)
    next_commit: dict[str, int] = field(default_factory=dict)
    next_release: dict[str, int] = field(default_factory=dict)
    commit_blocks: dict[str, frozenset[int]] = field(default_factory=dict)
    keep: dict[str, frozenset[int]] = field(default_factory=dict)
