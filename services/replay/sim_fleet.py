"""A whole fleet in one process: the router's admission core in front of simulated ranks.

The router part is the real `AdmissionQueue` over a `LocalStore`, driven by the virtual clock:
a pass runs on every arrival and every release, and every `tick_seconds` while requests wait
(as the router's 50 ms tick). Each admitted request is handed to its rank, whose real
`KVCacheManager` decides what is reused; the rank's slot reservation is released when the
request finishes. With `placement: prefix` the ranks' KV events feed the router's
`PrefixIndex` the way engines publish them (block tokens, chained from the parent).

Disaggregated (`context_ranks`, `generation_ranks` > 0): a turn is placed twice, as the live
router does (`services/router/handoff.py`). The context queue (strict affinity over context
ranks) sends it to a context rank, which prefills and parks it after the first token; its slot
is given back then. A second queue (`roles=GENERATION_ROLES`, pinned under
`<conversation>@generation`) places it on a generation rank, which reserves pages for what it
does not hold; the rest moves over the link (`sim_handoff.py`), the context rank releases its
hold, and the generation rank decodes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from pathlib import Path

from ...kvstore.events import KVEvent
from ...kvstore.manager import KVCacheManager
from ...kvstore.tiers.disk_files import SharedBlockSet
from ..core.cost_model import CostModel
from ..router.admission import GENERATION_ROLES, AdmissionConfig, AdmissionQueue
from ..router.handoff import GENERATION_PIN_SUFFIX
from ..router.model import Admission, PendingRequest, RankInfo, RankLoad, Role
from ..router.prefix_index import PrefixIndex
from ..router.store import LocalStore, StoreIntegrityError
from .sim_chip import Chip, make_chip
from .sim_clock import ScheduledEvent, VirtualClock
from .sim_config import FleetOptions, SimConfig
from .sim_dispatch import dispatch_seconds
from .sim_handoff import HandoffStats, Reservation, page_bytes_of
from .sim_moves import FleetMoves
from .sim_prefix_feed import PrefixFeed
from .sim_rank import SimRank
from .sim_request import SimRequest
from .sim_sizing import rank_kvstore
from .sim_step_log import SimStepLog

# Heartbeat timeout of the simulated router: ranks never go silent here.
_NEVER_SILENT_S = 1e12


class SimFleet:
    """Router admission plus ranks; the only writer of its admission queue and store."""

    def __init__(self, config: SimConfig, clock: VirtualClock | None = None) -> None:
        self.config = config
        self.clock = clock or VirtualClock()
        fleet = config.fleet
        self.costs = CostModel.from_figures(
            config.model, config.hardware, fleet.block_size, config.kv_dtype_bytes()
        )
        self.page_bytes = config.page_bytes()
        self.store = LocalStore()
        self.prefix_index = PrefixIndex()
        admission = AdmissionConfig(
            affinity=fleet.affinity,
            placement=fleet.placement,
            max_wait_passes=fleet.max_wait_passes,
            max_wait_seconds=fleet.max_wait_seconds,
            rehome_below=fleet.rehome_below,
            heartbeat_timeout_seconds=_NEVER_SILENT_S,
        )
        self.queue = AdmissionQueue(self.store, admission, self.clock.now, self.prefix_index)
        self.generation_queue = AdmissionQueue(
            self.store, admission, self.clock.now, self.prefix_index, roles=GENERATION_ROLES
        )
        self.ranks: dict[str, SimRank] = {}
        self.chips: list[Chip] = []
        # the fleet's one disk volume (the operator mounts one for all engine pods)
        share = fleet.disk_pages > 0 and fleet.disk_shared
        self.shared_disk: SharedBlockSet | None = SharedBlockSet() if share else None
        for index, (rank_id, role) in enumerate(rank_roles(fleet)):
            chip = None
            if fleet.ranks_per_chip > 1:
                if index % fleet.ranks_per_chip == 0:
                    self.chips.append(make_chip(self.clock, config.hardware))
                chip = self.chips[-1]
            self.ranks[rank_id] = self._build_rank(rank_id, role, chip)
            info = RankInfo(rank_id, "sim", fleet.slots, role=role, block_size=fleet.block_size)
            self.store.register_rank(info, self.clock.now())
        self._futures: dict[str, asyncio.Future[SimRequest]] = {}
        self._requests: dict[str, SimRequest] = {}
        self._prefix_feed = PrefixFeed(self.prefix_index, fleet.block_size)
        # the router's prefix index is read by prefix placement and by re-homing alone
        self._reads_index = fleet.placement == "prefix" or fleet.rehome_below > 0
        self._ids = itertools.count()
        self._tick: ScheduledEvent | None = None
        self.passes = 0
        self.deferrals = 0
        self.placements: dict[str, int] = {}
        self.handoffs: list[HandoffStats] = []
        self.moves = FleetMoves(self)

    # -- building --------------------------------------------------------------------------------

    def _build_rank(self, rank_id: str, role: Role, chip: Chip | None) -> SimRank:
        fleet = self.config.fleet
        kv_config, tiers = rank_kvstore(fleet, self.config.model, self.shared_disk)
        rank: SimRank | None = None

        def forward(event: KVEvent) -> None:
            if rank is not None:
                self._on_kv_event(rank, event)

        manager = KVCacheManager(kv_config, listener=forward, tiers=tiers, clock=self.clock.now)
        log = Path(fleet.step_log) / f"steps-{rank_id}.jsonl" if fleet.step_log else None
        rank = SimRank(
            rank_id,
            manager,
            self.costs,
            self.clock,
            fleet.slots,
            fleet.chunk_tokens,
            self._on_finished,
            fleet.max_decode_run_steps,
            role,
            self._on_parked,
            self._on_reserved,
            self.page_bytes,
            chip,
            SimStepLog(log) if log else None,
            self.config.hardware,
            fleet.onboard_pages_per_step,
        )
        return rank

    # -- requests --------------------------------------------------------------------------------

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
    ) -> SimRequest:
        """Queue one request at the router and wait (virtual time) until it finishes."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        if not tokens:
            raise ValueError("tokens: empty prompt")
        request_id = f"sim-{next(self._ids)}"
        now = self.clock.now()
        request = SimRequest(
            request_id, conversation_id, tokens, max_tokens, now, branch_hints=tuple(branch_hints)
        )
        future: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
        self._futures[request_id] = future
        self._requests[request_id] = request
        self.moves.arrived(request)
        prompt = tuple(tokens) if self._reads_index else ()
        self.queue.enqueue(PendingRequest(request_id, conversation_id, now, prompt_tokens=prompt))
        self._admission_pass()
        return await future

    def _admission_pass(self) -> None:
        """One router pass per queue; admitted requests go to their ranks; waiters get a tick."""
        for rank_id, rank in self.ranks.items():
            draining = rank_id in self.moves.draining
            load = RankLoad(0, len(rank.waiting), rank.kv_usage(), draining)
            self.store.heartbeat(rank_id, load, self.clock.now())
        for admission in self._run_pass(self.queue, ""):
            request = self._requests[admission.request.request_id]
            self.moves.placed(request, admission.rank.rank_id)
            self._dispatch(self.ranks[admission.rank.rank_id], request)
        self.moves.waiting(self._requests[p.request_id] for p in self.queue.waiting())
        if len(self.generation_queue):
            for admission in self._run_pass(self.generation_queue, "generation "):
                request_id = admission.request.request_id.removesuffix(GENERATION_PIN_SUFFIX)
                request = self._requests[request_id]
                request.reservation_id = admission.request.request_id
                self.ranks[admission.rank.rank_id].receive(request)
        waiting = len(self.queue) + len(self.generation_queue)
        if waiting and (self._tick is None or self._tick.cancelled):
            self._tick = self.clock.call_at(
                self.clock.now() + self.config.fleet.tick_seconds, self._on_tick
            )

    def _dispatch(self, rank: SimRank, request: SimRequest) -> None:
        """Hand an admitted request to its rank after the fleet's host path (its slot is held)."""
        delay = dispatch_seconds(self.config.hardware, request.prompt_len)
        if delay <= 0:
            rank.submit(request)
            return
        self.clock.call_at(self.clock.now() + delay, lambda: rank.submit(request))

    def _run_pass(self, queue: AdmissionQueue, label: str) -> list[Admission]:
        result = queue.run_pass()
        self.passes += 1
        self.deferrals += result.deferrals
        for admission in result.admitted:
            placement = f"{label}{admission.placement}"
            self.placements[placement] = self.placements.get(placement, 0) + 1
        return result.admitted

    def _on_tick(self) -> None:
        self._tick = None
        self._admission_pass()

    def _on_finished(self, request: SimRequest) -> None:
        """A rank is done with a request: free its slot, run a pass, wake its caller."""
        self.store.release(request.rank_id or "", request.reservation_id)
        context = self.ranks.get(request.context_rank_id or "")
        if context is not None and request.request_id in context.parked:
            context.release_hold(request)  # it failed on the generation rank before the move
        self._requests.pop(request.request_id, None)
        self.moves.finished(request)
        future = self._futures.pop(request.request_id)
        if not future.done():
            future.set_result(request)
        self._admission_pass()

    # -- hand-offs -------------------------------------------------------------------------------

    def _on_parked(self, request: SimRequest) -> None:
        """The context rank parked a turn: give its slot back, queue it for a generation rank."""
        self.store.release(request.rank_id or "", request.reservation_id)
        request.parked_s = self.clock.now()
        conversation = request.conversation_id
        self.generation_queue.enqueue(
            PendingRequest(
                f"{request.request_id}{GENERATION_PIN_SUFFIX}",
                f"{conversation}{GENERATION_PIN_SUFFIX}" if conversation else "",
                self.clock.now(),
                prompt_tokens=tuple(request.tokens)
                if self.config.fleet.placement == "prefix"
                else (),
            )
        )
        self._admission_pass()

    def _on_reserved(self, request: SimRequest, reservation: Reservation) -> None:
        """The generation rank has pages: move the blocks it lacks, then switch ranks."""
        context = self.ranks[request.context_rank_id or ""]
        moved = page_bytes_of(
            context.export_pages(request, reservation.held_blocks), self.page_bytes
        )
        unskipped = page_bytes_of(context.export_pages(request, 0), self.page_bytes)
        now = self.clock.now()
        seconds = self.costs.handoff_seconds(
            moved, reservation.host_pages_in, reservation.disk_pages_in
        )
        stats = HandoffStats(
            context.rank_id,
            request.rank_id or "",
            reservation.held_blocks,
            moved,
            unskipped,
            request.parked_s,
            now,
            now + seconds,
        )

        def transferred() -> None:
            request.handoff = stats
            self.handoffs.append(stats)
            context.release_hold(request)
            self.ranks[stats.generation_rank].adopt(request)

        self.clock.call_at(stats.done_s, transferred)

    def _on_kv_event(self, rank: SimRank, event: KVEvent) -> None:
        if self._reads_index:
            self._prefix_feed.on_event(rank.rank_id, rank.current, event)

    def close_step_logs(self) -> None:
        """Flush and close the ranks' step logs (the replay has ended)."""
        for rank in self.ranks.values():
            if rank.step_log is not None:
                rank.step_log.close()

    # -- invariants ------------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Every rank's kvstore and the admission store must add up; raise otherwise."""
        self.store.check_integrity()
        moving = {
            request.request_id.removesuffix(GENERATION_PIN_SUFFIX)
            for request in self.generation_queue.waiting()
        }
        for rank in self.ranks.values():
            moving.update(r.request_id for r in (*rank.receiving, *rank.in_transfer.values()))
        for rank in self.ranks.values():
            rank.manager.check_integrity()
            reserved = self.store.reservations().get(rank.rank_id, {})
            requests = (*rank.running, *rank.waiting, *rank.receiving, *rank.in_transfer.values())
            held = {r.reservation_id for r in requests}
            if set(reserved) != held:
                raise StoreIntegrityError(
                    f"{rank.rank_id}: reserved {sorted(reserved)} != held {sorted(held)}"
                )
            leaked = sorted(set(rank.parked) - moving)
            if leaked:
                raise StoreIntegrityError(
                    f"{rank.rank_id}: holds {leaked} parked with no hand-off queued or moving"
                )


def rank_roles(fleet: FleetOptions) -> list[tuple[str, Role]]:
    """Rank ids and roles: `rank-i` (both) aggregated, else `context-i` and `generation-i`."""
    if not fleet.disaggregated:
        return [(f"rank-{index}", Role.BOTH) for index in range(fleet.ranks)]
    return [(f"context-{i}", Role.CONTEXT) for i in range(fleet.context_ranks)] + [
        (f"generation-{i}", Role.GENERATION) for i in range(fleet.generation_ranks)
    ]
