"""The admission queue: strict/lenient affinity, bounded deferral, placement order, reservations.

No gRPC here: the router service, `kvfleet up` and the fleet simulator drive this same code
through `enqueue`, `run_pass` and `remove_silent_ranks`, with their own clock and store.

One admission pass takes the waiting requests in three groups, each in arrival order:

| group | requests                   | placed on                                          |
|-------|----------------------------|----------------------------------------------------|
| 1     | still pinned (below)       | home; when full: waits (strict), policy (lenient)  |
| 2     | with an explicit rank      | that rank; relaxed and full: policy                |
| 3     | released by the wait bound | home if it has room (as lenient), else policy      |
| 3     | new conversations          | policy                                             |

Still pinned: the pin is alive and, strict: the request is within its wait bound; lenient: its
home has room. Eligibility, not the pin alone, decides the group.

A deferral is a placement given up: a pass that makes a pinned request wait counts one only when
another rank had room for it, so passes on a fully busy fleet do not use up the bound.

A request placed away from its live home (wait bound, lenient away) names that home in its
`Admission.home`, so the rank it lands on can pull the conversation's KV from there. So does a
leaving home's turn (the home is shutting down, still registered): a leaving rank serves
pulls until it stops, and a pull that finds it gone costs only a read of the shared disk or a
recompute. A lost home (removed) is named nowhere: its blocks are on the shared disk, if
anywhere.

Placement by policy (groups 2 relaxed and 3, lenient away) skips draining ranks: a rank whose
pod is leaving on scale-in keeps serving its pinned turns, but gets nothing new. A rank that is
shutting down (`leaving`) gets its pinned turns no more either: they move at their next turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .model import PendingRequest, Placement, RankSlots, Role
from .pass_state import PassResult, PassState
from .policies import (
    AFFINITY_POLICIES,
    PLACEMENT_POLICIES,
    WaitBound,
)
from .prefix_index import PrefixIndex
from .store import AdmissionStore

REHOME_MIN_BLOCKS = 64  # shorter prompts stay home: their recompute is cheap wherever they run
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
    # A pinned turn whose home holds less than this share of its prompt's blocks (the prefix
    # index) is placed as a new conversation, and re-pinned where it lands; 0: never.
    rehome_below: float = 0.0
    heartbeat_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.affinity not in AFFINITY_POLICIES:
            raise ValueError(f"affinity: {self.affinity!r} not in {sorted(AFFINITY_POLICIES)}")
        if self.placement not in PLACEMENT_POLICIES:
            raise ValueError(f"placement: {self.placement!r} not in {sorted(PLACEMENT_POLICIES)}")
        if self.pin_ttl_seconds <= 0:
            raise ValueError(f"pin_ttl_seconds: {self.pin_ttl_seconds} <= 0")
        if not 0 <= self.rehome_below <= 1:
            raise ValueError(f"rehome_below: {self.rehome_below} not in [0, 1]")
        if self.heartbeat_timeout_seconds <= 0:
            raise ValueError(f"heartbeat_timeout_seconds: {self.heartbeat_timeout_seconds} <= 0")
        WaitBound(self.max_wait_passes, self.max_wait_seconds)


def open_for_placement(ranks: dict[str, RankSlots]) -> dict[str, RankSlots]:
    """The ranks a policy may place a request on: every rank that is not draining.

    NOTE: when every rank of the pool is draining (a pool scaled to zero), all of them stay
    open, so requests are served until the ranks leave instead of timing out in the queue;
    a leaving rank (shutting down) never is.
    """
    staying = {rank_id: slots for rank_id, slots in ranks.items() if not slots.load.draining}
    return staying or {rank_id: slots for rank_id, slots in ranks.items() if not slots.load.leaving}


# Placement of a pinned request that stops waiting for its home, per affinity policy.
RELEASED_PLACEMENT = {
    "strict": Placement.FALLBACK,
    "lenient": Placement.AWAY,
    "none": Placement.NEW,
}


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
        self._index = prefix_index or PrefixIndex()
        self._placement = PLACEMENT_POLICIES[config.placement](self._index)
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
        every_rank = self.store.snapshot()
        state = PassState(
            affinity=AFFINITY_POLICIES["lenient" if degraded else self.config.affinity],
            now=self._clock(),
            ranks={
                rank_id: slots
                for rank_id, (slots, _) in every_rank.items()
                if slots.info.role in self.roles
            },
        )
        conversations = {r.conversation_id for r in self._waiting if r.conversation_id}
        pins = self.store.get_pins(conversations, state.now) if conversations else {}
        pinned, explicit, others = self._group(state, pins)
        self._admit_pinned(state, pinned)
        self._admit_explicit(state, explicit)
        self._admit_released_and_new(state, others)

        result = state.result
        result.free_slots = {rank_id: slots.free for rank_id, (slots, _) in every_rank.items()}
        for admission in result.admitted:
            result.free_slots[admission.rank.rank_id] -= admission.request.slots
        self._waiting = [r for r in self._waiting if r.request_id not in state.done]
        return result

    def _admit_pinned(self, state: PassState, pinned: list[tuple[PendingRequest, str]]) -> None:
        """Group 1: home when it has room; else wait for it (strict) or go by policy."""
        free = state.free
        for request, home in pinned:
            if free[home] >= request.slots and self._reserve(request, home, free, state.now):
                state.admit(request, home, Placement.PINNED)
            elif state.affinity.waits_for_home(request, state.waited(request), self._bound):
                # NOTE: a deferral is a placement given up: it counts only when another rank
                # had room. A pass where every rank is full (or a periodic tick with nothing
                # new) costs the request nothing, so it must not use up the bound; counting
                # those sent returning turns away after a few 50 ms ticks on a saturated fleet.
                if self._room_elsewhere(request, home, state.ranks, free):
                    request.deferrals += 1
                    state.result.deferrals += 1
                # NOTE: hold what is left of the home rank for this request during the pass, so
                # later requests cannot take the slots it waits for (a parent needing several).
                free[home] -= min(free[home], request.slots)
            else:
                rank_id = self._place(request, state.ranks, free, state.now)
                if rank_id is not None:
                    state.admit(request, rank_id, RELEASED_PLACEMENT[state.affinity.name], home)

    def _admit_explicit(self, state: PassState, explicit: list[PendingRequest]) -> None:
        """Group 2: the named rank; relaxed: by policy when it is full; gone: failed."""
        for request in explicit:
            rank_id = request.explicit_rank
            has_room = rank_id in state.ranks and state.free[rank_id] >= request.slots
            if has_room and self._reserve(request, rank_id, state.free, state.now):
                state.admit(request, rank_id, Placement.EXPLICIT)
            elif request.relax_rank:
                placed = self._place(request, state.ranks, state.free, state.now)
                if placed is not None:
                    state.admit(request, placed, Placement.AWAY)
            elif rank_id not in state.ranks:
                state.fail(request, f"rank {rank_id!r} is no longer registered")

    def _admit_released_and_new(
        self, state: PassState, others: list[tuple[PendingRequest, str | None]]
    ) -> None:
        """Group 3: a request released from its wait is placed as lenient affinity places (its
        home first when it has room); a new conversation by the placement policy, as is a
        leaving home's turn (its home named, as the KV's source)."""
        for request, home in others:
            leaving = home is not None and state.ranks[home].load.leaving
            has_room = home is not None and not leaving and state.free[home] >= request.slots
            if has_room and self._reserve(request, home, state.free, state.now):
                state.admit(request, home, Placement.PINNED)
                continue
            rank_id = self._place(request, state.ranks, state.free, state.now)
            if rank_id is not None:
                fresh = home is None or leaving
                released = Placement.NEW if fresh else RELEASED_PLACEMENT[state.affinity.name]
                if request.request_id in state.rehomed:
                    released = Placement.REHOMED
                state.admit(request, rank_id, released, home)

    def _home_lost_it(self, request: PendingRequest, home: str, state: PassState) -> bool:
        """Whether the home holds some but less than `rehome_below` of the prompt's blocks, by
        the prefix index. Some: an index that never saw this prompt's start on the home (this
        replica restarted, or the home publishes to another replica) says nothing, and the
        turn stays home."""
        share = self.config.rehome_below
        if share <= 0:
            return False
        keys = request.keys_for(state.ranks[home].info.block_size)
        if len(keys) < REHOME_MIN_BLOCKS:
            return False
        return 0 < self._index.overlap(home, keys) < share * len(keys)

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
        self, state: PassState, pins: dict[str, str]
    ) -> tuple[
        list[tuple[PendingRequest, str]],
        list[PendingRequest],
        list[tuple[PendingRequest, str | None]],
    ]:
        """Split the queue into the three placement groups, keeping arrival order in each."""
        pinned: list[tuple[PendingRequest, str]] = []
        explicit: list[PendingRequest] = []
        others: list[tuple[PendingRequest, str | None]] = []
        for request in self._waiting:
            if request.explicit_rank is not None:
                explicit.append(request)
                continue
            home = pins.get(request.conversation_id) if state.affinity.keeps_home else None
            if home not in state.ranks:
                others.append((request, None))
            elif state.ranks[home].load.leaving:
                others.append((request, home))  # it moves (re-pinned), pulling from its home
            elif self._home_lost_it(request, home, state):
                state.rehomed.add(request.request_id)
                others.append((request, None))
            elif state.affinity.still_pinned(
                request, state.waited(request), self._bound, state.free[home] >= request.slots
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
