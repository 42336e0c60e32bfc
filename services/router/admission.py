"""The admission queue: strict/lenient affinity, bounded deferral, placement order, reservations.

No gRPC here: the router service, `kvfleet up` and the fleet simulator drive this same code
through `enqueue`, `run_pass` and `remove_silent_ranks`, with their own clock and store.

One admission pass, over the requests in arrival order:

| group | who                                             | where                              |
|-------|-------------------------------------------------|------------------------------------|
| 1     | still pinned: home alive and, strict: within    | home rank; when full: waits        |
|       | the wait bound; lenient: home has room          | (strict) or policy (lenient)       |

A deferral is a placement given up: a pass that makes a pinned request wait counts one only when
another rank had room for it, so passes on a fully busy fleet do not use up the bound.
| 2     | explicit rank                                   | that rank; relaxed: policy if full |
| 3     | new conversations, pins released by the bound   | placement policy                   |

Placement by policy (groups 2 relaxed and 3, lenient away) skips draining ranks: a rank whose
pod is leaving on scale-in keeps serving its pinned turns, but gets nothing new.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvfleet.services.router.model import Admission, PendingRequest, Placement, RankSlots, Role
from kvfleet.services.router.policies import (
    AFFINITY_POLICIES,
    PLACEMENT_POLICIES,
    AffinityPolicy,
    WaitBound,
)
from kvfleet.services.router.prefix_index import PrefixIndex
from kvfleet.services.router.store import AdmissionStore

# Ranks a new request may start on; generation-only ranks get work by KV hand-off, placed by
# a second queue over GENERATION_ROLES (see runtime.py).
ADMITTING_ROLES = frozenset({Role.BOTH, Role.CONTEXT})
GENERATION_ROLES = frozenset({Role.GENERATION})


@dataclass(frozen=True)
class AdmissionConfig:
    """How the queue admits; names are keys of the policy registries."""

    affinity: str = "strict"
    placement: str = "load"
    # Strict affinity's wait, bounded in time only (docs/simulator.md, "Shipped defaults"): a
    # returning turn's prefix saves more than it waits, up to ~30 s of a saturated fleet.
    max_wait_passes: int = 1_000_000
    max_wait_seconds: float = 30.0
    pin_ttl_seconds: float = 3600.0
    heartbeat_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.affinity not in AFFINITY_POLICIES:
            raise ValueError(f"affinity: {self.affinity!r} not in {sorted(AFFINITY_POLICIES)}")
        if self.placement not in PLACEMENT_POLICIES:
            raise ValueError(f"placement: {self.placement!r} not in {sorted(PLACEMENT_POLICIES)}")
        if self.pin_ttl_seconds <= 0:
            raise ValueError(f"pin_ttl_seconds: {self.pin_ttl_seconds} <= 0")
        if self.heartbeat_timeout_seconds <= 0:
            raise ValueError(f"heartbeat_timeout_seconds: {self.heartbeat_timeout_seconds} <= 0")
        WaitBound(self.max_wait_passes, self.max_wait_seconds)


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


def open_for_placement(ranks: dict[str, RankSlots]) -> dict[str, RankSlots]:
    """The ranks a policy may place a request on: every rank that is not draining.

    NOTE: when every rank of the pool is draining (a pool scaled to zero), all of them stay
    open, so requests are served until the ranks leave instead of timing out in the queue.
    """
    staying = {rank_id: slots for rank_id, slots in ranks.items() if not slots.load.draining}
    return staying or ranks


# Placement of a pinned request that stops waiting for its home, per affinity policy.
RELEASED_PLACEMENT = {"strict": Placement.FALLBACK, "lenient": Placement.AWAY}


class AdmissionQueue:
    """Waiting requests and the passes that admit them. The only writer of its queue."""

    def __init__(
        self,
        store: AdmissionStore,
        config: AdmissionConfig,
        clock: Callable[[], float],
        prefix_index: PrefixIndex | None = None,
        roles: frozenset[Role] = ADMITTING_ROLES,
    ) -> None:
        self.store = store
        # The pool this queue places on: its ranks alone count (a pin elsewhere is no pin).
        self.roles = roles
        self.config = config
        self._clock = clock
        self._bound = WaitBound(config.max_wait_passes, config.max_wait_seconds)
        self._placement = PLACEMENT_POLICIES[config.placement](prefix_index or PrefixIndex())
        self._waiting: list[PendingRequest] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting(self) -> list[PendingRequest]:
        """The queue in arrival order (a copy)."""
        return list(self._waiting)

    def enqueue(self, request: PendingRequest) -> None:
        """Append a request; it is considered from the next pass on."""
        if request.child_samples < 0:
            raise ValueError(f"child_samples: {request.child_samples} < 0")
        self._waiting.append(request)

    def cancel(self, request_id: str) -> bool:
        """Drop a waiting request; False when it is not waiting (admitted or unknown)."""
        for i, request in enumerate(self._waiting):
            if request.request_id == request_id:
                del self._waiting[i]
                return True
        return False

    def run_pass(self, degraded: bool = False) -> PassResult:
        """Admit what fits now. `degraded`: the shared store is away, use lenient affinity."""
        affinity = AFFINITY_POLICIES["lenient" if degraded else self.config.affinity]
        now = self._clock()
        every_rank = self.store.snapshot()
        ranks = {
            rank_id: slots
            for rank_id, (slots, _) in every_rank.items()
            if slots.info.role in self.roles
        }
        free = {rank_id: slots.free for rank_id, slots in ranks.items()}
        conversations = {r.conversation_id for r in self._waiting if r.conversation_id}
        pins = self.store.get_pins(conversations, now) if conversations else {}

        pinned, explicit, others = self._group(affinity, now, ranks, free, pins)
        result = PassResult()
        admitted_ids: set[str] = set()
        failed_ids: set[str] = set()

        def admit(request: PendingRequest, rank_id: str, placement: Placement) -> None:
            result.admitted.append(Admission(request, ranks[rank_id].info, placement))
            admitted_ids.add(request.request_id)

        for request, home in pinned:
            if free[home] >= request.slots and self._reserve(request, home, free, now):
                admit(request, home, Placement.PINNED)
            elif affinity.waits_for_home(request, now - request.enqueued_at, self._bound):
                # NOTE: a deferral is a placement given up: it counts only when another rank
                # had room. A pass where every rank is full (or a periodic tick with nothing
                # new) costs the request nothing, so it must not use up the bound; counting
                # those sent returning turns away after a few 50 ms ticks on a saturated fleet.
                if self._room_elsewhere(request, home, ranks, free):
                    request.deferrals += 1
                    result.deferrals += 1
                # NOTE: hold what is left of the home rank for this request during the pass, so
                # later requests cannot take the slots it waits for (a parent needing several).
                free[home] -= min(free[home], request.slots)
            else:
                rank_id = self._place(request, ranks, free, now)
                if rank_id is not None:
                    admit(request, rank_id, RELEASED_PLACEMENT[affinity.name])

        for request in explicit:
            rank_id = request.explicit_rank
            has_room = rank_id in ranks and free[rank_id] >= request.slots
            if has_room and self._reserve(request, rank_id, free, now):
                admit(request, rank_id, Placement.EXPLICIT)
                continue
            if request.relax_rank:
                placed = self._place(request, ranks, free, now)
                if placed is not None:
                    admit(request, placed, Placement.AWAY)
            elif rank_id not in ranks:
                result.failed.append((request, f"rank {rank_id!r} is no longer registered"))
                failed_ids.add(request.request_id)

        for request, released_from in others:
            rank_id = self._place(request, ranks, free, now)
            if rank_id is not None:
                placement = (
                    Placement.NEW if released_from is None else RELEASED_PLACEMENT[affinity.name]
                )
                admit(request, rank_id, placement)

        result.free_slots = {rank_id: slots.free for rank_id, (slots, _) in every_rank.items()}
        for admission in result.admitted:
            result.free_slots[admission.rank.rank_id] -= admission.request.slots
        done = admitted_ids | failed_ids
        self._waiting = [r for r in self._waiting if r.request_id not in done]
        return result

    def remove_silent_ranks(self) -> list[str]:
        """Remove ranks whose last heartbeat is older than the timeout; returns their ids."""
        now = self._clock()
        timeout = self.config.heartbeat_timeout_seconds
        silent = [
            rank_id
            for rank_id, (_, last_heartbeat) in self.store.snapshot().items()
            if now - last_heartbeat > timeout
        ]
        for rank_id in silent:
            self.store.remove_rank(rank_id)
        return silent

    def _group(
        self,
        affinity: AffinityPolicy,
        now: float,
        ranks: dict[str, RankSlots],
        free: dict[str, int],
        pins: dict[str, str],
    ) -> tuple[list[tuple[PendingRequest, str]], list[PendingRequest], list[tuple]]:
        """Split the queue into the three placement groups, keeping arrival order in each."""
        pinned: list[tuple[PendingRequest, str]] = []
        explicit: list[PendingRequest] = []
        others: list[tuple[PendingRequest, str | None]] = []
        for request in self._waiting:
            if request.explicit_rank is not None:
                explicit.append(request)
                continue
            home = pins.get(request.conversation_id)
            if home not in ranks:
                others.append((request, None))
            elif affinity.still_pinned(
                request, now - request.enqueued_at, self._bound, free[home] >= request.slots
            ):
                pinned.append((request, home))
            else:
                others.append((request, home))
        return pinned, explicit, others

    @staticmethod
    def _room_elsewhere(
        request: PendingRequest, home: str, ranks: dict[str, RankSlots], free: dict[str, int]
    ) -> bool:
        """Whether a rank other than `home` could take the request in this pass."""
        return any(
            rank_id != home and free[rank_id] >= request.slots
            for rank_id in open_for_placement(ranks)
        )

    def _place(
        self,
        request: PendingRequest,
        ranks: dict[str, RankSlots],
        free: dict[str, int],
        now: float,
    ) -> str | None:
        """Admit on the best rank with room, by the placement policy; None when none fits."""
        candidates = [
            RankSlots(slots.info, slots.info.max_batch_size - free[rank_id], slots.load)
            for rank_id, slots in open_for_placement(ranks).items()
            if free[rank_id] >= request.slots
        ]
        for slots in self._placement.order(request, candidates):
            if self._reserve(request, slots.info.rank_id, free, now):
                return slots.info.rank_id
        return None

    def _reserve(
        self, request: PendingRequest, rank_id: str, free: dict[str, int], now: float
    ) -> bool:
        """Reserve in the store; a refusal means another router took the room."""
        if self.store.try_admit(
            rank_id,
            request.request_id,
            request.slots,
            request.conversation_id,
            self.config.pin_ttl_seconds,
            now,
        ):
            free[rank_id] -= request.slots
            return True
        free[rank_id] = 0
        return False
