"""The router's side of prefetch and of moving a conversation with its KV, in the simulator.

| event                               | switch       | what the router and ranks do              |
|-------------------------------------|--------------|-------------------------------------------|
| a turn ends on its home             | `prefetch`   | after the conversation's own gaps say     |
|                                     |              | (`TurnGaps`), the home holds its blocks   |
| a pinned turn waits for a home slot | `prefetch`   | the home onboards it meanwhile            |
| a turn is placed away from its home | `migrate_kv` | the new rank pulls what the home (else    |
|                                     |              | the shared disk) has; the pin moves too   |
| a rank drains (`drain_rank` at      | -            | it flushes its retained turns to disk,    |
| `drain_at_s`)                       |              | its pins move to survivors                |

A draining rank leaves once it holds no request; from then on its blocks come only from the
shared disk, modelled as its kvstore frozen at that moment and cut to each conversation's
retained turns (what the drain flushed; the sim's disk tier is per rank).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..router.model import Role
from ..router.turn_gaps import TurnGaps
from .sim_request import SimRequest

if TYPE_CHECKING:
    from .sim_fleet import SimFleet
    from .sim_rank import SimRank


@dataclass
class Move:
    """One turn placed away from its conversation's home."""

    request: SimRequest
    home: str
    source: str  # "home", "disk" or "none": where its prefix was pulled from
    after_drain: bool  # its home was drained
    home_had_tokens: int  # of its prompt, what the home (or the shared disk) had


class FleetMoves:
    """Homes, gaps, holds and drains of one simulated fleet; the only writer of its records."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet
        options = fleet.config.fleet
        self.prefetch = options.prefetch and not options.disaggregated
        self.migrate = options.migrate_kv and not options.disaggregated
        self.gaps = TurnGaps()
        self.homes: dict[str, str] = {}  # conversation -> rank of its last turn
        self.moved: list[Move] = []
        self.draining: set[str] = set()
        self.departed: dict[str, SimRank] = {}
        self.drained_conversations: set[str] = set()
        self.flushed_blocks = 0
        self.host_bytes_in = 0  # host -> device bytes the turns' admissions onboarded
        self.disk_bytes_in = 0
        self._onboarding: set[str] = set()  # waiting requests whose home was asked already
        if options.drain_rank:
            if options.drain_rank not in fleet.ranks:
                raise ValueError(f"drain_rank {options.drain_rank!r} not in {sorted(fleet.ranks)}")
            fleet.clock.call_at(options.drain_at_s, lambda: self.drain(options.drain_rank))

    # -- turns -----------------------------------------------------------------------------------

    def arrived(self, request: SimRequest) -> None:
        """A turn reached the router."""
        if request.conversation_id:
            self.gaps.turn_arrived(request.conversation_id, self.fleet.clock.now())

    def waiting(self, requests: Iterable[SimRequest]) -> None:
        """After a pass: pinned turns that wait for their home get onboarded there meanwhile."""
        if not self.prefetch:
            return
        pins = self.fleet.store.pins()
        for request in requests:
            home = pins.get(request.conversation_id, ("", 0.0))[0]
            rank = self.fleet.ranks.get(home)
            if rank is None or request.request_id in self._onboarding:
                continue
            self._onboarding.add(request.request_id)
            rank.prefetch(request.conversation_id, request.tokens, self._bound_s())

    def placed(self, request: SimRequest, rank_id: str) -> None:
        """The router admitted a turn on `rank_id`: pull its prefix if it left its home."""
        self._onboarding.discard(request.request_id)
        conversation = request.conversation_id
        home = self.homes.get(conversation)
        if conversation:
            self.homes[conversation] = rank_id
        if home is None or home == rank_id:
            return
        request.moved_from = home
        for rank in self.fleet.ranks.values():
            if rank.rank_id != rank_id:
                rank.release_hold_of(conversation)  # a prefetch on the old home
        had = self._source_tokens(home, request)
        move = Move(request, home, "none", home in self.draining, had)
        self.moved.append(move)
        if not self.migrate or had == 0:
            return
        alive = home in self.fleet.ranks
        costs = self.fleet.costs
        per_byte = costs.handoff_s_per_byte if alive else 1 / (self._disk_gb_s() * 1e9)
        rank = self.fleet.ranks[rank_id]
        request.pulled_bytes = rank.import_prefix(conversation, request.tokens[:had], per_byte)
        if request.pulled_bytes:
            move.source = "home" if alive else "disk"
            rank.wake_at(rank.ready_at(request))

    def finished(self, request: SimRequest) -> None:
        """A turn ended on its rank: schedule its home's prefetch by the conversation's gaps."""
        conversation = request.conversation_id
        if not conversation or request.error is not None:
            return
        now = self.fleet.clock.now()
        self.host_bytes_in += request.host_bytes_in
        self.disk_bytes_in += request.disk_bytes_in
        self.gaps.turn_ended(conversation, now)
        self._maybe_leave(request.rank_id or "")
        if not self.prefetch:
            return
        window = self.gaps.window(conversation)
        rank = self.fleet.ranks.get(request.rank_id or "")
        if window is None or rank is None or rank.role is not Role.BOTH:
            return
        tokens = request.tokens
        hold_for = max(0.0, window.hold_for_s - window.start_after_s)

        def start() -> None:
            if self.homes.get(conversation) == rank.rank_id and rank.rank_id in self.fleet.ranks:
                rank.prefetch(conversation, tokens, hold_for)

        self.fleet.clock.call_at(now + window.start_after_s, start)

    # -- drain (scale-in) --------------------------------------------------------------------------

    def drain(self, rank_id: str) -> None:
        """Mark the rank leaving, flush its retained turns to disk, re-pin its conversations."""
        fleet = self.fleet
        rank = fleet.ranks[rank_id]
        self.draining.add(rank_id)
        self.flushed_blocks += rank.manager.flush_retained_to_disk()
        survivors = [r for r in fleet.ranks if r not in self.draining]
        pins = fleet.store.pins()
        moved = sorted(conv for conv, (home, _) in pins.items() if home == rank_id)
        for index, conversation in enumerate(moved):
            expires_at = pins[conversation][1]
            fleet.store.set_pin(conversation, survivors[index % len(survivors)], expires_at)
            self.drained_conversations.add(conversation)
            rank.release_hold_of(conversation)
        self._maybe_leave(rank_id)

    def _maybe_leave(self, rank_id: str) -> None:
        fleet = self.fleet
        rank = fleet.ranks.get(rank_id)
        if rank_id not in self.draining or rank is None or not rank.idle:
            return
        if rank.receiving or rank.in_transfer or rank.parked:
            return
        for conversation in list(rank.holds):
            rank.release_hold_of(conversation)
        fleet.store.remove_rank(rank_id)
        self.departed[rank_id] = fleet.ranks.pop(rank_id)

    # -- sources ---------------------------------------------------------------------------------

    def _source_tokens(self, home: str, request: SimRequest) -> int:
        """Tokens of the prompt the home (alive) or the shared disk (it left) can send."""
        alive = self.fleet.ranks.get(home)
        if alive is not None:
            return alive.prefix_on_hand(request.conversation_id, request.tokens)
        gone = self.departed.get(home)
        if gone is not None:
            return gone.prefix_on_hand(request.conversation_id, request.tokens, True)
        return 0

    def _bound_s(self) -> float:
        return self.fleet.config.fleet.max_wait_seconds

    def _disk_gb_s(self) -> float:
        return self.fleet.config.hardware.disk_read_gb_s
