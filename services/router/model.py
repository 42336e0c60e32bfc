"""Plain records the admission core works on: ranks, slot snapshots, waiting requests."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .prefix_index import UNSALTED_ROOT, chain_keys


class Role(enum.StrEnum):
    """What part of serving a rank does (mirrors kvfleet.RankRole)."""

    BOTH = "both"
    CONTEXT = "context"
    GENERATION = "generation"


@dataclass(frozen=True)
class RankInfo:
    """A registered engine rank."""

    rank_id: str
    address: str
    max_batch_size: int
    role: Role = Role.BOTH
    block_size: int = 16

    def __post_init__(self) -> None:
        if not self.rank_id:
            raise ValueError("rank_id: empty")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size: {self.max_batch_size} < 1 for rank {self.rank_id}")
        if self.block_size < 1:
            raise ValueError(f"block_size: {self.block_size} < 1 for rank {self.rank_id}")


@dataclass(frozen=True)
class RankLoad:
    """Load a rank reports on its heartbeat (advisory; slots are counted by reservations)."""

    free_slots: int = 0
    queued: int = 0
    kv_usage: float = 0.0
    draining: bool = False  # leaving on scale-in: no new conversations are placed here
    # Shutting down within its drain window: nothing new is placed here (pinned turns move),
    # and a refused call does not get the rank removed (its streams run out their grace).
    leaving: bool = False


@dataclass(frozen=True)
class RankSlots:
    """One rank's slot count at the start of an admission pass."""

    info: RankInfo
    used: int
    load: RankLoad = field(default_factory=RankLoad)

    @property
    def free(self) -> int:
        return max(0, self.info.max_batch_size - self.used)


class Placement(enum.StrEnum):
    """Why a request was admitted where it was."""

    PINNED = "pinned"  # on its pinned rank (strict or lenient)
    EXPLICIT = "explicit"  # on the rank the client named
    NEW = "new"  # a conversation without a pin, placed by policy
    FALLBACK = "fallback"  # a pinned request placed by policy after its deferral bound
    AWAY = "away"  # lenient: pinned rank full, placed by policy elsewhere
    REHOMED = "rehomed"  # its home had lost most of its prefix: placed by policy, pinned anew


@dataclass
class PendingRequest:
    """A request waiting in the admission queue. Only the admission queue mutates it."""

    request_id: str
    conversation_id: str
    enqueued_at: float
    child_samples: int = 0
    explicit_rank: str | None = None
    relax_rank: bool = False
    prompt_tokens: tuple[int, ...] = ()
    # Where the prompt's block keys chain from: the tenant's cache salt (prefix_index.py).
    prefix_root: int = UNSALTED_ROOT
    deferrals: int = 0
    # The prompt's chained block keys per block size, hashed once (prefix_index.chain_keys).
    block_keys: dict[int, list[int]] = field(default_factory=dict, repr=False, compare=False)

    def keys_for(self, block_size: int) -> list[int]:
        """The prompt's block keys at `block_size`, computed at the first ask."""
        keys = self.block_keys.get(block_size)
        if keys is None:
            keys = self.block_keys[block_size] = chain_keys(
                self.prompt_tokens, block_size, self.prefix_root
            )
        return keys

    @property
    def slots(self) -> int:
        """Slots the request takes: the parent plus one per child sample."""
        return 1 + self.child_samples


@dataclass(frozen=True)
class Admission:
    """A request admitted onto a rank; its slots are reserved in the store."""

    request: PendingRequest
    rank: RankInfo
    placement: Placement
    # The conversation's home when the request was placed away from it (wait bound, home full
    # under lenient affinity) and the home still serves: where its KV is to pull from.
    home: RankInfo | None = None
