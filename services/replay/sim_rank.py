"""One simulated engine rank: a real KVCacheManager, continuous batching, a cost model for time.

Scheduling follows the engine's (`services/engine/scheduler.py`): each step takes the running
requests first (a decode token each, or the next prefill chunk), then admits waiting requests
first come first served while the token budget lasts. When pages run short it releases the
retained turns of the conversation whose context ended longest ago to the LRU (still matchable,
offloaded to host when evicted), then preempts the newest running request (recompute). A
request that cannot fit even alone fails. A context rank parks a request after its first
token and a generation rank receives hand-offs (`sim_handoff.HandoffSide`).

Only the kvstore's bookkeeping runs here; the step's duration comes from `CostModel`, and the
step's results apply at its end on the virtual clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.tiers.metrics import DISK, HOST
from kvfleet.services.router.model import Role

from .sim_clock import ScheduledEvent, VirtualClock
from .sim_costs import CostModel, StepWork
from .sim_handoff import HandoffSide, ReservedCallback
from .sim_request import SimRequest

FinishedCallback = Callable[[SimRequest], None]


@dataclass(frozen=True)
class Chunk:
    """One request's share of a step: tokens [start, start + count)."""

    request: SimRequest
    start: int
    count: int
    host_pages_in: int = 0  # pages onboarded from host / disk at this chunk's admission
    disk_pages_in: int = 0


@dataclass
class DecodeRun:
    """Decode steps of a fixed batch scheduled as one event; `ends` holds each step's end."""

    requests: list[SimRequest]
    ends: list[float]
    steps: int
    event: ScheduledEvent | None = None


class SimRank(HandoffSide):
    """The engine side of one rank; the only caller of its kvstore manager."""

    def __init__(
        self,
        rank_id: str,
        manager: KVCacheManager,
        costs: CostModel,
        clock: VirtualClock,
        max_batch_size: int,
        token_budget: int,
        on_finished: FinishedCallback,
        max_decode_run: int = 64,
        role: Role = Role.BOTH,
        on_parked: FinishedCallback | None = None,
        on_reserved: ReservedCallback | None = None,
    ) -> None:
        self.rank_id = rank_id
        self.role = role
        self.manager = manager
        self.costs = costs
        self.clock = clock
        self.max_batch_size = max_batch_size
        self.token_budget = token_budget
        self.on_finished = on_finished
        self.max_decode_run = max_decode_run
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.steps = 0
        self.busy_s = 0.0
        self.preemptions = 0
        self.released_conversations = 0
        self.current: SimRequest | None = None  # whose kvstore call is running (KV events)
        self._busy = False
        self._run: DecodeRun | None = None
        # Conversations by their last context end, oldest first: who gives pages back first.
        self._retained: OrderedDict[str, None] = OrderedDict()
        self._init_handoff(on_parked, on_reserved)

    # -- membership ------------------------------------------------------------------------------

    def submit(self, request: SimRequest) -> None:
        """Queue an admitted request; a rank with nothing to do starts a step now."""
        request.rank_id = self.rank_id
        self.manager.add_request(request.request_id, request.tokens, request.conversation_id)
        self.waiting.append(request)
        self._wake()

    def _wake(self) -> None:
        """Something changed: end a decode run after its step in flight, or start a step."""
        if self._run is not None:
            self._cut_run()
        if not self._busy:
            self._busy = True
            self.clock.call_at(self.clock.now(), self._start_step)

    @property
    def idle(self) -> bool:
        """True when the rank holds no request."""
        return not self.running and not self.waiting

    def kv_usage(self) -> float:
        """Share of device pages that are in use (held by a request or retained turn)."""
        pools = self.manager.pools.values()
        usable = sum(pool.num_usable for pool in pools) or 1
        return sum(pool.num_in_use for pool in pools) / usable

    # -- steps -----------------------------------------------------------------------------------

    def _start_step(self) -> None:
        self._reserve_received()
        if self._start_decode_run():
            return
        chunks = self._schedule()
        # NOTE: pages held by hand-offs come back without a step here, and wake the rank then.
        while not chunks and not self.idle and not self.pages_coming_back:
            self._fail(self.running[0] if self.running else self.waiting[0])
            chunks = self._schedule()
        if not chunks:
            self._busy = False
            return
        work = StepWork(
            prefill_spans=tuple(
                (c.start, c.start + c.count) for c in chunks if not c.request.context_done
            ),
            decode_contexts=tuple(c.start for c in chunks if c.request.context_done),
            host_pages_in=sum(c.host_pages_in for c in chunks),
            disk_pages_in=sum(c.disk_pages_in for c in chunks),
        )
        duration = self.costs.step_seconds(work)
        self.steps += 1
        self.busy_s += duration
        self.clock.call_at(self.clock.now() + duration, lambda: self._end_step(chunks))

    def _end_step(self, chunks: list[Chunk]) -> None:
        now = self.clock.now()
        for chunk in chunks:
            request = chunk.request
            if request.rank_id != self.rank_id or request not in self.running:
                continue
            request.computed = chunk.start + chunk.count
            if not request.context_done:
                self._commit(request)
                if request.computed < request.prompt_len:
                    continue
                self._end_context(request)
            request.generated += 1
            request.token_times.append(now)
            if request.finished:
                self._finish(request)
            elif self.parks:
                self._park(request)
        self._start_step()

    # -- decode runs: many identical-shape decode steps as one event --------------------------

    def _start_decode_run(self) -> bool:
        """Run up to `max_decode_run` decode steps as one event when nothing else can change.

        Only when every running request decodes, none is waiting, and no step needs a page:
        then the steps are exactly what single steps would do, and an arrival cuts the run at
        the end of the step in flight (`_cut_run`), as it would join a single step's successor.
        """
        if self.max_decode_run < 2 or self.waiting or not self.running:
            return False
        if not all(r.context_done for r in self.running):
            return False
        steps = min(
            self.max_decode_run,
            min(r.max_tokens - r.generated for r in self.running),
            min(r.pages_tokens - r.computed for r in self.running),
        )
        if steps < 2:
            return False
        contexts = tuple(r.computed for r in self.running)
        now = self.clock.now()
        ends = []
        for offset in range(steps):
            work = StepWork(decode_contexts=tuple(c + offset for c in contexts))
            now += self.costs.step_seconds(work)
            ends.append(now)
        run = DecodeRun(list(self.running), ends, steps)
        run.event = self.clock.call_at(ends[-1], lambda: self._end_run(run))
        self._run = run
        self.steps += steps
        self.busy_s += ends[-1] - self.clock.now()
        return True

    def _cut_run(self) -> None:
        """End the run in flight after the step that is being computed now."""
        run = self._run
        done = sum(1 for end in run.ends[: run.steps] if end <= self.clock.now())
        keep = min(run.steps, done + 1)
        if keep == run.steps:
            return
        run.event.cancel()
        self.steps -= run.steps - keep
        self.busy_s -= run.ends[run.steps - 1] - run.ends[keep - 1]
        run.steps = keep
        run.event = self.clock.call_at(run.ends[keep - 1], lambda: self._end_run(run))

    def _end_run(self, run: DecodeRun) -> None:
        self._run = None
        times = run.ends[: run.steps]
        for request in run.requests:
            request.computed += run.steps
            request.generated += run.steps
            request.token_times.extend(times)
            if request.finished:
                self._finish(request)
        self._start_step()

    # -- single steps ----------------------------------------------------------------------------

    def _schedule(self) -> list[Chunk]:
        budget = self.token_budget
        chunks: list[Chunk] = []
        for request in list(self.running):
            if budget == 0:
                break
            if request not in self.running:
                continue  # preempted while making room for an older one
            count = (
                1 if request.context_done else min(request.prompt_len - request.computed, budget)
            )
            scheduled = {chunk.request for chunk in chunks}
            if not self._make_room(request, count, scheduled):
                continue
            self._allocate(request, count)
            chunks.append(Chunk(request, request.computed, count))
            budget -= count
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            chunk = self._admit(self.waiting[0], budget)
            if chunk is None:
                break  # first come, first served: later ones wait behind it
            chunks.append(chunk)
            budget -= chunk.count
        return chunks

    def _admit(self, request: SimRequest, budget: int) -> Chunk | None:
        """Admit the head of the queue into KV (releasing retained turns if needed), or None."""
        manager, rid = self.manager, request.request_id

        def fits() -> bool:
            start = manager.match(rid).num_reusable_tokens
            return manager.can_admit(rid, min(request.prompt_len - start, budget))

        if not fits() and not self._release_retained(fits):
            return None
        match = manager.match(rid)
        start = match.num_reusable_tokens
        count = min(request.prompt_len - start, budget)
        host = sum(tier == HOST for where in match.locations.values() for tier in where)
        disk = sum(tier == DISK for where in match.locations.values() for tier in where)
        self.current = request
        try:
            allocation = manager.admit(rid, count)
        finally:
            self.current = None
        self.waiting.popleft()
        self.running.append(request)
        if request.cached_tokens is None:
            request.cached_tokens = start
        request.host_pages_in += host
        request.disk_pages_in += disk
        request.computed = request.committed = start
        request.pages_tokens = allocation.num_tokens_with_pages
        return Chunk(request, start, count, host, disk)

    # -- kvstore bookkeeping ---------------------------------------------------------------------

    def _allocate(self, request: SimRequest, count: int) -> None:
        """Pages for `count` more tokens (a decode step mostly needs none).

        NOTE: decode tokens are committed here, when a step needs a new page, not after every
        step: output blocks are never matched (their tokens are the sim's own), and the
        manager's commit costs a pass over the page table after the context ends.
        """
        if request.computed + count <= request.pages_tokens:
            return
        self._commit(request)
        allocation = self.manager.allocate(request.request_id, count)
        request.pages_tokens = allocation.num_tokens_with_pages

    def _fits(self, request: SimRequest, count: int) -> bool:
        if request.computed + count <= request.pages_tokens:
            return True
        self._commit(request)
        return self.manager.can_allocate(request.request_id, count)

    def _commit(self, request: SimRequest) -> None:
        """Tell the manager how far the request has computed (commits blocks per policy)."""
        if request.committed == request.computed:
            return
        self.current = request
        try:
            self.manager.commit(request.request_id, request.computed)
        finally:
            self.current = None
        request.committed = request.computed
        self.retry_reserve = True  # window pages may have slid out

    def _end_context(self, request: SimRequest) -> None:
        """The prompt is computed: retain this turn, drop older ones (not twice after recompute)."""
        request.context_done = True
        if not request.retain:
            return
        self.manager.finish_context(request.request_id)
        conversation = request.conversation_id
        if conversation and self.manager.retained_turns(conversation):
            self._retained[conversation] = None
            self._retained.move_to_end(conversation)

    def _finish(self, request: SimRequest) -> None:
        self.retry_reserve = True
        self.running.remove(request)
        self.manager.finish_request(request.request_id)
        self.on_finished(request)

    def _fail(self, request: SimRequest) -> None:
        """Drop a request that cannot fit on this rank even alone."""
        pools = {name: pool.num_usable for name, pool in self.manager.pools.items()}
        request.error = (
            f"rank {self.rank_id}: {request.prompt_len}-token prompt (+{request.generated} "
            f"generated) does not fit in the KV pools {pools} "
            f"(block {self.manager.config.block_size})"
        )
        for queue in (self.running, self.waiting, self.receiving):
            if request in queue:
                queue.remove(request)
                break
        self.manager.finish_request(request.request_id)
        self.retry_reserve = True
        self.on_finished(request)

    # -- memory pressure ---------------------------------------------------------------------------

    def _make_room(self, request: SimRequest, count: int, scheduled: set[SimRequest]) -> bool:
        """Make `count` more tokens fit: drop retained turns, then preempt newer requests."""

        def fits() -> bool:
            return self._fits(request, count)

        if fits() or self._release_retained(fits):
            return True
        while not fits():
            victims = [r for r in self.running if r is not request and r not in scheduled]
            if not victims:
                return False
            self._preempt(victims[-1])
        return True

    def _release_retained(self, fits: Callable[[], bool]) -> bool:
        """Release whole conversations' retained turns, oldest context end first, until `fits()`.

        NOTE: released, not dropped: the pages go to the LRU, so they stay matchable until
        evicted and the tiers offload them then (a drop would free them, losing the prefix).
        """
        while self._retained:
            conversation, _ = self._retained.popitem(last=False)
            if self.manager.can_release_conversation(conversation):
                self.released_conversations += 1
                self.manager.release_conversation(conversation)
            if fits():
                return True
        return False

    def _preempt(self, victim: SimRequest) -> None:
        """Give back a running request's pages; it re-queues first and recomputes its prompt.

        NOTE: the recompute covers the prompt only; its generated tokens' KV is not modelled.
        """
        self.running.remove(victim)
        self.manager.finish_request(victim.request_id)
        self.retry_reserve = True
        self.manager.add_request(victim.request_id, victim.tokens, victim.conversation_id)
        victim.retain = victim.retain and not victim.context_done
        victim.context_done = False
        victim.computed = victim.committed = victim.pages_tokens = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
