"""One request as the simulated fleet tracks it, from arrival to its last token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sim_handoff import HandoffStats


@dataclass(eq=False)
class SimRequest:
    """A request's progress on its rank. The rank that runs it is its only writer.

    `computed` counts tokens with KV (prompt, then one per decode step); `cached_tokens` is the
    prefix the kvstore reported reusable at the first admission (a preempted request keeps it).
    A disaggregated turn changes writer at its hand-off: the context rank parks it, the
    generation rank runs it from its reservation on (`rank_id` then names the generation rank).
    """

    request_id: str
    conversation_id: str
    tokens: list[int]
    max_tokens: int
    arrival_s: float
    rank_id: str | None = None
    cached_tokens: int | None = None
    computed: int = 0
    pages_tokens: int = 0
    committed: int = 0
    generated: int = 0
    context_done: bool = False
    retain: bool = True
    host_pages_in: int = 0
    disk_pages_in: int = 0
    host_bytes_in: int = 0  # bytes of those pages
    disk_bytes_in: int = 0
    moved_from: str | None = None  # its conversation's home, when it was placed elsewhere
    pulled_bytes: int = 0  # of its prefix, pulled from that home or the shared disk
    preemptions: int = 0
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    reservation_id: str = ""  # the router's slot reservation it holds now
    context_rank_id: str | None = None  # where its KV was parked for a hand-off
    parked_s: float | None = None  # when the context rank parked it
    handoff: HandoffStats | None = None
    branch_hints: tuple[int, ...] = ()  # prompt positions later turns may branch off at
    retention_seconds: float = 0.0  # the client's cache TTL (0: the reuse policy's)

    def __post_init__(self) -> None:
        self.reservation_id = self.reservation_id or self.request_id

    @property
    def key(self) -> str:
        """What its rank's kvstore manager tracks it by."""
        return self.request_id

    @property
    def prompt_len(self) -> int:
        """Prompt tokens."""
        return len(self.tokens)

    @property
    def finished(self) -> bool:
        """True once every requested token was generated (or the request failed)."""
        return self.error is not None or self.generated >= self.max_tokens
