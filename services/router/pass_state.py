"""What one admission pass works on and what it decided (see admission.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Admission, PendingRequest, Placement, RankSlots
from .policies import AffinityPolicy


@dataclass
class PassResult:
    """What one admission pass did."""

    admitted: list[Admission] = field(default_factory=list)
    deferrals: int = 0
    failed: list[tuple[PendingRequest, str]] = field(default_factory=list)
    free_slots: dict[str, int] = field(default_factory=dict)  # per rank, after the pass

    def count(self, placement: Placement) -> int:
        """Admissions with this placement."""
        return sum(1 for admission in self.admitted if admission.placement is placement)


@dataclass
class PassState:
    """One pass's view: the pool's ranks, free slots as the pass reserves, what it decided."""

    affinity: AffinityPolicy
    now: float
    ranks: dict[str, RankSlots]
    free: dict[str, int] = field(default_factory=dict)
    result: PassResult = field(default_factory=PassResult)
    done: set[str] = field(default_factory=set)  # admitted or failed: leave the queue
    rehomed: set[str] = field(default_factory=set)  # pinned turns placed as new (rehome_below)

    def __post_init__(self) -> None:
        self.free = {rank_id: slots.free for rank_id, slots in self.ranks.items()}

    def waited(self, request: PendingRequest) -> float:
        return self.now - request.enqueued_at

    def admit(
        self, request: PendingRequest, rank_id: str, placement: Placement, home: str | None = None
    ) -> None:
        """Record an admission; `home`: the conversation's pinned rank it was placed away from."""
        away = self.ranks[home].info if home is not None and home != rank_id else None
        self.result.admitted.append(Admission(request, self.ranks[rank_id].info, placement, away))
        self.done.add(request.request_id)

    def fail(self, request: PendingRequest, reason: str) -> None:
        self.result.failed.append((request, reason))
        self.done.add(request.request_id)
