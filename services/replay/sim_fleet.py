"""A whole fleet in one process: the router's admission core in front of simulated ranks.

The router part is the real `AdmissionQueue` over a `LocalStore`, driven by the virtual clock:
a pass runs on every arrival and every release, and every `tick_seconds` while requests wait
(as the router's 50 ms tick). Each admitted request is handed to its rank, whose real
`KVCacheManager` decides what is reused; the rank's slot reservation is released when the
request finishes. With `placement: prefix` the ranks' KV events feed the router's
`PrefixIndex` the way engines publish them (block tokens, chained from the parent).
"""

from __future__ import annotations

import asyncio
import itertools

from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.events import KVEvent, KVEventKind
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import make_reuse_policy
from kvfleet.kvstore.sizing import TypicalStep, plan_pools
from kvfleet.kvstore.tiers.stack import KVTiers
from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, RankInfo, RankLoad
from kvfleet.services.router.prefix_index import PrefixIndex
from kvfleet.services.router.store import LocalStore, StoreIntegrityError

from .sim_clock import ScheduledEvent, VirtualClock
from .sim_config import FleetOptions, SimConfig
from .sim_costs import CostModel
from .sim_rank import SimRank
from .sim_request import SimRequest

# Heartbeat timeout of the simulated router: ranks never go silent here.
_NEVER_SILENT_S = 1e12


class SimFleet:
    """Router admission plus ranks; the only writer of its admission queue and store."""

    def __init__(self, config: SimConfig, clock: VirtualClock | None = None) -> None:
        self.config = config
        self.clock = clock or VirtualClock()
        fleet = config.fleet
        self.costs = CostModel.from_figures(config.model, config.hardware, fleet.block_size)
        self.store = LocalStore()
        self.prefix_index = PrefixIndex()
        self.queue = AdmissionQueue(
            self.store,
            AdmissionConfig(
                affinity=fleet.affinity,
                placement=fleet.placement,
                max_wait_passes=fleet.max_wait_passes,
                max_wait_seconds=fleet.max_wait_seconds,
                heartbeat_timeout_seconds=_NEVER_SILENT_S,
            ),
            self.clock.now,
            self.prefix_index,
        )
        self.ranks: dict[str, SimRank] = {}
        for index in range(fleet.ranks):
            rank_id = f"rank-{index}"
            self.ranks[rank_id] = self._build_rank(rank_id)
            info = RankInfo(rank_id, "sim", fleet.slots, block_size=fleet.block_size)
            self.store.register_rank(info, self.clock.now())
        self._futures: dict[str, asyncio.Future[SimRequest]] = {}
        self._requests: dict[str, SimRequest] = {}
        self._prefix_feed = PrefixFeed(self.prefix_index, fleet.block_size)
        self._ids = itertools.count()
        self._tick: ScheduledEvent | None = None
        self.passes = 0
        self.deferrals = 0
        self.placements: dict[str, int] = {}

    # -- building --------------------------------------------------------------------------------

    def _build_rank(self, rank_id: str) -> SimRank:
        fleet = self.config.fleet
        life_cycles = self.config.model.build_life_cycles()
        policy_params = {"max_num_turns": fleet.max_num_turns}
        if fleet.reuse_policy != "per_conversation":
            policy_params = {}
        policy = make_reuse_policy(fleet.reuse_policy, **policy_params)
        step = typical_step(fleet, policy.retained_turns)
        pool_pages = plan_pools(step, life_cycles, fleet.block_size, fleet.gpu_pages).pool_pages
        kv_config = KVStoreConfig(
            fleet.block_size, life_cycles, pool_pages, policy, checkpoint=fleet.checkpoint
        )
        names = [lc.name for lc in life_cycles]
        tiers = None
        if fleet.host_pages or fleet.disk_pages:
            tiers = KVTiers(
                _split(fleet.host_pages, pool_pages),
                _split(fleet.disk_pages, pool_pages),
                dict.fromkeys(names, 0),
            )
        rank: SimRank | None = None

        def forward(event: KVEvent) -> None:
            if rank is not None:
                self._on_kv_event(rank, event)

        manager = KVCacheManager(kv_config, listener=forward, tiers=tiers)
        rank = SimRank(
            rank_id,
            manager,
            self.costs,
            self.clock,
            fleet.slots,
            fleet.chunk_tokens,
            self._on_finished,
            fleet.max_decode_run_steps,
        )
        return rank

    # -- requests --------------------------------------------------------------------------------

    async def generate(
        self, conversation_id: str, tokens: list[int], max_tokens: int
    ) -> SimRequest:
        """Queue one request at the router and wait (virtual time) until it finishes."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        if not tokens:
            raise ValueError("tokens: empty prompt")
        request_id = f"sim-{next(self._ids)}"
        now = self.clock.now()
        request = SimRequest(request_id, conversation_id, tokens, max_tokens, now)
        future: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
        self._futures[request_id] = future
        self._requests[request_id] = request
        prompt = tuple(tokens) if self.config.fleet.placement == "prefix" else ()
        self.queue.enqueue(PendingRequest(request_id, conversation_id, now, prompt_tokens=prompt))
        self._admission_pass()
        return await future

    def _admission_pass(self) -> None:
        """One router pass; admitted requests go to their ranks; waiters get a tick."""
        for rank_id, rank in self.ranks.items():
            load = RankLoad(0, len(rank.waiting), rank.kv_usage())
            self.store.heartbeat(rank_id, load, self.clock.now())
        result = self.queue.run_pass()
        self.passes += 1
        self.deferrals += result.deferrals
        for admission in result.admitted:
            placement = str(admission.placement)
            self.placements[placement] = self.placements.get(placement, 0) + 1
            request = self._requests[admission.request.request_id]
            self.ranks[admission.rank.rank_id].submit(request)
        if len(self.queue) and (self._tick is None or self._tick.cancelled):
            self._tick = self.clock.call_at(
                self.clock.now() + self.config.fleet.tick_seconds, self._on_tick
            )

    def _on_tick(self) -> None:
        self._tick = None
        self._admission_pass()

    def _on_finished(self, request: SimRequest) -> None:
        """A rank is done with a request: free its slot, run a pass, wake its caller."""
        self.store.release(request.rank_id or "", request.request_id)
        self._requests.pop(request.request_id, None)
        future = self._futures.pop(request.request_id)
        if not future.done():
            future.set_result(request)
        self._admission_pass()

    def _on_kv_event(self, rank: SimRank, event: KVEvent) -> None:
        if self.config.fleet.placement == "prefix":
            self._prefix_feed.on_event(rank.rank_id, rank.current, event)

    # -- invariants ------------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Every rank's kvstore and the admission store must add up; raise otherwise."""
        self.store.check_integrity()
        for rank in self.ranks.values():
            rank.manager.check_integrity()
            reserved = self.store.reservations().get(rank.rank_id, {})
            held = {r.request_id for r in (*rank.running, *rank.waiting)}
            if set(reserved) != held:
                raise StoreIntegrityError(
                    f"{rank.rank_id}: reserved {sorted(reserved)} != held {sorted(held)}"
                )


def typical_step(fleet: FleetOptions, turns_per_conversation: int) -> TypicalStep:
    """The step a rank's pools are split for: its slots resident, plus the retained turns of
    `retained_conversations` conversations between turns (none when the policy retains none).

    NOTE: a conversation's retained turns share its full-attention prefix, so each turn counts
    1/turns of the longest context on whole-prefix pools, and its own endpoint (and checkpoint)
    windows on window pools.
    """
    retained = fleet.retained_conversations * turns_per_conversation
    return TypicalStep(
        fleet.slots,
        fleet.max_context_tokens,
        fleet.chunk_tokens,
        retained,
        fleet.checkpoint,
        fleet.max_context_tokens // max(1, turns_per_conversation),
    )


def _split(total: int, pool_pages: dict[str, int]) -> dict[str, int]:
    """A lower tier's pages split like the device pools."""
    weight = sum(pool_pages.values())
    return {name: total * pages // weight for name, pages in pool_pages.items()}


class PrefixFeed:
    """Turns a rank's KV events into the router's prefix index entries, as an engine would.

    A stored block is keyed by its tokens and its parent, both read from the request whose
    kvstore call committed it; blocks of other origins (none here) are skipped.
    """

    def __init__(self, index: PrefixIndex, block_size: int) -> None:
        self.index = index
        self.block_size = block_size
        self._request: SimRequest | None = None
        self._hashes: list[int] = []
        self._positions: dict[int, int] = {}

    def on_event(self, rank_id: str, request: SimRequest | None, event: KVEvent) -> None:
        """Apply one KV event of `rank_id`, committed while `request` was being served."""
        if event.kind is KVEventKind.REMOVED:
            self.index.removed(rank_id, [event.block_hash])
            return
        if request is None:
            return
        if request is not self._request:
            # NOTE: events come in bursts per request; hash its prompt once per burst.
            self._request = request
            self._hashes = block_hashes(request.tokens, self.block_size)
            self._positions = {h: i for i, h in enumerate(self._hashes)}
        position = self._positions.get(event.block_hash)
        if position is None:
            return
        size = self.block_size
        parent = None if position == 0 else self._hashes[position - 1]
        tokens = request.tokens[position * size : (position + 1) * size]
        self.index.stored(rank_id, [event.block_hash], parent, tokens, size)
