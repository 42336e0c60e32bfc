"""One simulated engine rank: a real KVCacheManager, continuous batching, a cost model for time.

Scheduling is the engine's own step rule (`services/core/step_planner.py`, shared with
`services/engine/core/scheduler.py`): running requests first (a decode token each, or the next
prefill chunk), then waiting requests first come first served while the token budget lasts;
short of pages, release the oldest retained conversation to the LRU, then preempt the newest
running request (recompute). This class supplies the hooks: pages are taken only when a step
needs a new one, and admission counts the pages onboarded from host/disk. A request that
cannot fit even alone fails. A context rank parks a request after its first token and a
generation rank receives hand-offs (`sim_handoff.HandoffSide`).

Only the kvstore's bookkeeping runs here; the step's duration comes from `CostModel`, and the
step's results apply at its end on the virtual clock (`sim_decode_run.py` batches decode-only
steps into one event). Ranks that share one accelerator compute their steps on one chip
(`SharedChip`, or `SlicedChip` by time slices: each step's chip work slowed by the others in
flight; no decode runs, whose steps would interleave with the other ranks').

With `hardware.decode_overlap` a decode step hides its host work behind the step before, as
the engine's overlapped decode does (services/engine/core/lookahead.py): where the engine
would look ahead (this step decodes exactly the requests of the step before, none ended in
it, and they come first among the running ones: requests may wait, a prefill short of pages may
stall behind them), the step's overhead counts only for what outlasts the chip time of the step
before, so a steady decode's cycle is the longer of the two, not their sum.
"""

from __future__ import annotations

from collections.abc import Callable

from ...kvstore.admission import MatchShrankError
from ...kvstore.manager import KVCacheManager
from ...kvstore.tiers.metrics import DISK
from ..core.cost_figures import Hardware
from ..core.cost_model import CostModel, StepWork
from ..core.step_planner import StepPlanner
from ..router.model import Role
from .sim_chip import Chip
from .sim_clock import VirtualClock
from .sim_decode_run import DecodeRun, plan_decode_run
from .sim_dispatch import admission_seconds, piece_seconds
from .sim_handoff import HandoffSide, ReservedCallback
from .sim_holds import Hold, HoldSide
from .sim_onboard_ahead import AHEAD_HOLD_SECONDS, OnboardAhead, ahead_key
from .sim_request import SimRequest
from .sim_step import Chunk, KVAdmission, step_work
from .sim_step_log import SimStepLog

FinishedCallback = Callable[[SimRequest], None]


class SimRank(HandoffSide, HoldSide, StepPlanner[SimRequest, Chunk]):
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
        page_bytes: dict[str, int] | None = None,
        chip: Chip | None = None,
        step_log: SimStepLog | None = None,
        hardware: Hardware | None = None,
        onboard_pages_per_step: int = 0,
    ) -> None:
        StepPlanner.__init__(self, manager, max_batch_size, token_budget)
        self.rank_id = rank_id
        self.role = role
        self.costs = costs
        self.clock = clock
        self.on_finished = on_finished
        self.chip = chip
        self.max_decode_run = max_decode_run if chip is None else 1
        self.steps = 0
        self.busy_s = 0.0
        self.prefill_busy_s = 0.0  # of busy_s: steps that compute a prefill chunk
        self.current: SimRequest | None = None  # whose kvstore call is running (KV events)
        self._busy = False
        self._run: DecodeRun | None = None
        self._init_handoff(on_parked, on_reserved)
        self._init_holds()
        self.page_bytes = page_bytes or {}
        self.step_log = step_log
        self.hardware = hardware  # its admission figures (sim_dispatch.admission_seconds)
        self._disk_pages_written = 0  # disk-tier writes charged to the core thread so far
        # NOTE: the engine's piece is a prefix hold, which on window or state life cycles
        # resumes nowhere mid-prompt: such a model's admission onboards everything at once
        whole = all(lc.kind == "full" for lc in manager.life_cycles.values())
        self.onboard_ahead = OnboardAhead(onboard_pages_per_step if whole else 0, hardware)
        self._pieces_s = 0.0  # this step's pieces of prefixes brought up ahead (core thread)
        self._pieces_in = (0, 0)  # ... and the (host, disk) pages they brought up
        self._core_free_s = 0.0  # the core thread runs other work until then (no step)
        self._core_debt_s = 0.0  # ... and this much after the step in flight
        # (when the last step's chip work began, its requests' ids): set after a decode step
        # the engine would look ahead from (decode_overlap), else None
        self._ahead: tuple[float, frozenset[int]] | None = None

    @property
    def released_conversations(self) -> int:
        """Conversations whose retained turns were released to make room."""
        return self.retained.released

    # -- membership ------------------------------------------------------------------------------

    def submit(self, request: SimRequest) -> None:
        """Queue an admitted request; a rank with nothing to do starts a step now."""
        request.rank_id = self.rank_id
        self._track(request, request.tokens)
        self.waiting.append(request)
        self._wake()

    def _wake(self) -> None:
        """Something changed: end a decode run after its step in flight, or start a step."""
        if self._run is not None:
            self._cut_run()
        if not self._busy:
            self._busy = True
            self.clock.call_at(self.clock.now(), self._start_step)

    def _ready(self, item: SimRequest) -> bool:
        # A turn whose blocks are being pulled in waits for them (the pull wakes the rank).
        return self.ready_at(item) <= self.clock.now()

    @property
    def pulling(self) -> bool:
        """True while a waiting turn's blocks are still being pulled in (it wakes the rank)."""
        now = self.clock.now()
        return any(self.ready_at(request) > now for request in self.waiting)

    def wake_at(self, when: float) -> None:
        """Start a step at `when` (a pull lands then)."""
        self.clock.call_at(when, self._wake)

    def _free_for(self, fits) -> bool:
        return self._free_until(fits)

    def _branch_hints(self, item: SimRequest) -> tuple[int, ...]:
        return item.branch_hints

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

    @property
    def _decode_overlap(self) -> bool:
        """Decode steps hide their host work behind the step before (`hardware.decode_overlap`)."""
        return self.hardware is not None and self.hardware.decode_overlap

    def _hold_core(self, seconds: float) -> float:
        """The core thread runs `seconds` of work between steps (a prefetch's onboarding): now
        when no step is in flight, else after it; the next step starts that much later. Returns
        when the work is done (after the step in flight: counted from now)."""
        now = self.clock.now()
        self.busy_s += seconds
        if not self._busy:
            self._core_free_s = max(self._core_free_s, now) + seconds
            return self._core_free_s
        self._core_debt_s += seconds
        self._wake()  # a decode run ends after its step in flight
        return max(self._core_free_s, now) + self._core_debt_s

    def _core_wait(self) -> bool:
        """True when the core thread is busy with work between steps: the step starts later."""
        now = self.clock.now()
        if self._core_debt_s:
            self._core_free_s = max(self._core_free_s, now) + self._core_debt_s
            self._core_debt_s = 0.0
        if self._core_free_s <= now:
            return False
        self.clock.call_at(self._core_free_s, self._start_step)
        return True

    def _start_step(self) -> None:
        ahead, self._ahead = self._ahead, None
        if self._core_wait():
            return
        self._reserve_received()
        if self._start_decode_run(ahead):
            return
        waiting = {id(request) for request in self.waiting}
        self._pieces_s, self._pieces_in = 0.0, (0, 0)
        chunks = self.plan_step()
        # NOTE: pages held by hand-offs come back without a step here, and wake the rank then.
        while not chunks and not self.idle and not self.pages_coming_back and not self.pulling:
            self._fail(self.running[0] if self.running else self.waiting[0])
            chunks = self.plan_step()
        if not chunks:
            self._busy = False
            return
        work = step_work(chunks, self._pieces_in)
        # the admissions' and the disk writes' host work comes first: the step, and every
        # running sequence, waits
        admit_s = self._admission_seconds([c for c in chunks if id(c.request) in waiting])
        admit_s += self._disk_write_seconds() + self._pieces_s
        duration = self.costs.step_seconds(work)
        # the step's host work is this process's own; only the rest waits for the chip
        host_s = self.costs.host_seconds(duration)
        chip_s = duration - host_s
        if ahead is not None and self._looks_ahead(ahead[1], chunks):
            # planned and launched while the step before ran on the chip (since ahead[0])
            hidden_s = min(host_s, self.clock.now() - ahead[0])
            host_s -= hidden_s
            duration -= hidden_s
        self.steps += 1
        self.busy_s += admit_s + duration
        if work.prefill_spans:
            self.prefill_busy_s += admit_s + duration
        started = self.clock.now() + admit_s  # the step log's start, as the engine logs it
        chip_from = started + host_s
        if self.chip is None:
            self.clock.call_at(
                started + duration, lambda: self._end_step(chunks, started, work, chip_from)
            )
            return
        chip = self.chip
        kernels = chip.prefill_kernels if work.prefill_spans else 0
        self.clock.call_at(
            chip_from,
            lambda: chip.run(
                chip_s,
                lambda: self._end_step(chunks, started, work, chip_from),
                chip_s / kernels if kernels else 0.0,
            ),
        )

    def _looks_ahead(self, before: frozenset[int], chunks: list[Chunk]) -> bool:
        """True when the engine would have planned this step while the step before (of the
        requests `before`) ran: decodes of exactly the requests before, which come first among
        the running ones (any other, a prefill short of pages, runs behind them)."""
        flying = len(before)
        return (
            len(chunks) == flying <= len(self.running)
            and all(c.request.context_done and id(c.request) in before for c in chunks)
            and all(id(r) in before for r in self.running[:flying])
        )

    def _admission_seconds(self, admitted: list[Chunk]) -> float:
        """The engine's add and admission of this step's admitted requests (0 with no figures)."""
        if self.hardware is None or not admitted:
            return 0.0
        host_pages = sum(chunk.host_pages_in for chunk in admitted)
        disk_pages = sum(chunk.disk_pages_in for chunk in admitted)
        return admission_seconds(self.hardware, len(admitted), host_pages, disk_pages)

    def _disk_write_seconds(self) -> float:
        """The core thread's disk-tier writes since the last step (0 with no figure): the
        kvstore flushes them as the step's pages are taken."""
        if self.hardware is None or not self.hardware.disk_write_ms_per_page:
            return 0.0
        written = self.manager.tiers.metrics[DISK].pages_in
        new, self._disk_pages_written = written - self._disk_pages_written, written
        return new * self.hardware.disk_write_ms_per_page / 1e3

    def _end_step(
        self, chunks: list[Chunk], started: float, work: StepWork, chip_from: float
    ) -> None:
        now = self.clock.now()
        if self.step_log is not None:
            self.step_log.step(started, now, work)
        for chunk in chunks:
            request = chunk.request
            if request.rank_id != self.rank_id or request not in self.running:
                continue
            request.computed = chunk.start + chunk.count
            if not request.context_done:
                self._commit(request)
                if request.computed < request.prompt_len:
                    continue
                self.context_ended(request)
            request.generated += 1
            request.token_times.append(now)
            if request.finished:
                self._finish(request)
            elif self.parks:
                self._park(request)
        # (a request that ended or parked leaves the running ones: _looks_ahead says no)
        if self._decode_overlap and not work.prefill_spans:
            self._ahead = (chip_from, frozenset(id(c.request) for c in chunks))
        self._start_step()

    # -- decode runs: many identical-shape decode steps as one event --------------------------

    def _start_decode_run(self, ahead: tuple[float, frozenset[int]] | None) -> bool:
        """Run up to `max_decode_run` decode steps as one event when nothing else can change."""
        if self.waiting:
            return False
        now = self.clock.now()
        hidden_s = 0.0  # of the first step's host work, done while the step before ran
        if ahead is not None and {id(r) for r in self.running} == ahead[1]:
            hidden_s = now - ahead[0]
        run = plan_decode_run(
            self.running, self.costs, now, self.max_decode_run, self._decode_overlap, hidden_s
        )
        if run is None:
            return False
        run.event = self.clock.call_at(run.end_s, lambda: self._end_run(run))
        run.started_s = now
        self._run = run
        self.steps += run.steps
        self.busy_s += run.end_s - now
        return True

    def _cut_run(self) -> None:
        """End the run in flight after the step that is being computed now."""
        run = self._run
        dropped = run.cut_after(self.clock.now())
        if dropped is None:
            return
        run.event.cancel()
        self.steps -= dropped[0]
        self.busy_s -= dropped[1]
        run.event = self.clock.call_at(run.end_s, lambda: self._end_run(run))

    def _end_run(self, run: DecodeRun) -> None:
        self._run = None
        times = run.ends[: run.steps]
        if self.step_log is not None:
            contexts = tuple(request.computed for request in run.requests)
            self.step_log.decode_run(run.started_s, times, contexts)
        for request in run.requests:
            request.computed += run.steps
            request.generated += run.steps
            request.token_times.extend(times)
            if request.finished:
                self._finish(request)
        if self._decode_overlap:
            last = self.costs.decode_seconds(r.computed - 1 for r in run.requests)
            chip_from = run.end_s - (last - self.costs.host_seconds(last))
            self._ahead = (chip_from, frozenset(id(r) for r in run.requests))
        self._start_step()

    # -- single steps: the hooks of the engine's step rule ----------------------------------------

    def _next_count(self, request: SimRequest, budget: int) -> int:
        return 1 if request.context_done else min(request.prompt_len - request.computed, budget)

    def _grow(self, request: SimRequest, count: int) -> Chunk:
        self._allocate(request, count)
        return Chunk(request, request.computed, count)

    def _admit(self, request: SimRequest, budget: int) -> Chunk | None:
        """Admit a waiting request into KV after its reusable prefix, or None when short (or
        a piece of its prefix came up this step instead)."""
        rid = request.request_id
        blocks = self.onboard_ahead.next_piece_blocks(
            rid, lambda: self.manager.match(rid), bool(self.running)
        )
        if blocks is not None and self._bring_up_piece(request, blocks):
            return None  # the running sequences step meanwhile
        admitted = self._admit_pages(request, budget)
        if admitted is None:
            return None
        self.onboard_ahead.forget(rid)
        start = admitted.start
        if request.cached_tokens is None:
            request.cached_tokens = start
        request.host_pages_in += admitted.host_pages_in
        request.disk_pages_in += admitted.disk_pages_in
        request.computed = request.committed = start
        request.pages_tokens = admitted.allocation.num_tokens_with_pages
        # the pages end where the match said the prefix would: a shorter reuse computes more
        count = min(request.prompt_len - start, budget, request.pages_tokens - start)
        return Chunk(request, start, count, admitted.host_pages_in, admitted.disk_pages_in)

    def _bring_up_piece(self, request: SimRequest, blocks: int) -> bool:
        """Hold the request's prompt up to `blocks` blocks, onboarding its host/disk blocks
        there (the engine's piece), the previous piece's hold taken over; True when blocks came
        up: the core thread's time for them is this step's (`_pieces_s`)."""
        manager, key = self.manager, ahead_key(request.request_id)
        piece_id = f"ahead-{self.rank_id}-{next(self._hold_ids)}"
        end = blocks * manager.config.block_size + max(1, manager.config.max_replay_tokens)
        manager.add_prefix_request(piece_id, request.request_id, end)
        if manager.match(piece_id).num_reusable_tokens == 0 or not self._free_until(
            lambda: manager.can_admit(piece_id, 0), keep=key
        ):
            manager.finish_request(piece_id)
            self.onboard_ahead.forget(request.request_id)
            return False
        host, disk = self._lower_pages(manager.match(piece_id))
        try:
            manager.admit(piece_id, 0)
        except MatchShrankError:  # the admission brings up what is left, as the engine's
            manager.finish_request(piece_id)
            self.onboard_ahead.forget(request.request_id)
            return False
        self.release_hold_of(key)  # its pages are this piece's match now
        host_pages, disk_pages = sum(host.values()), sum(disk.values())
        hold = Hold(piece_id, key, self.clock.now(), host_pages, disk_pages)
        self._keep(hold, AHEAD_HOLD_SECONDS)
        self.onboard_ahead.brought(request.request_id, host_pages + disk_pages)
        if not host_pages + disk_pages:
            return False
        # their read on the core thread pauses the rank before the step; their copies are the
        # step's, as an admission's pages are
        self._pieces_s += piece_seconds(self.hardware, host_pages, disk_pages)
        self._pieces_in = (self._pieces_in[0] + host_pages, self._pieces_in[1] + disk_pages)
        return True

    def _recompute_tokens(self, victim: SimRequest) -> list[int]:
        # NOTE: the recompute covers the prompt only; its generated tokens' KV is not modelled.
        return victim.tokens

    def _on_preempted(self, victim: SimRequest, num_tokens: int) -> None:
        self.retry_reserve = True
        victim.context_done = False
        victim.computed = victim.committed = victim.pages_tokens = 0
        victim.preemptions += 1

    # -- kvstore bookkeeping ---------------------------------------------------------------------

    def _admit_pages(self, request: SimRequest, budget: int) -> KVAdmission | None:
        """Admit a prompt after its reusable prefix, at most `budget` new tokens, releasing
        retained turns if needed; None when it does not fit."""
        manager, rid = self.manager, request.request_id

        def fits() -> bool:
            return manager.admissible_tokens(rid, budget) is not None

        if not self._free_until(fits, keep=request.conversation_id):
            return None
        match = manager.match(rid)
        start = match.num_reusable_tokens
        host_pages, disk_pages = self._lower_pages(match)
        host, disk = sum(host_pages.values()), sum(disk_pages.values())
        self.current = request
        try:
            allocation = manager.admit(rid, min(request.prompt_len - start, budget))
        except MatchShrankError:
            # What is left of its match did not fit (fewer disk blocks each time). With others
            # running it waits a step, as in the engine; alone, the engine's next loop matches
            # again at once.
            return None if self.running else self._admit_pages(request, budget)
        finally:
            self.current = None
        request.host_bytes_in += self._bytes(host_pages)
        request.disk_bytes_in += self._bytes(disk_pages)
        # A hold's pages are the match's own now; its onboarding was charged when it ran.
        self.take_hold(request)
        self.release_hold_of(ahead_key(request.request_id))  # so are its pieces
        # What the admission really reused: less than the match where a block it counted was
        # gone when read (another rank's index evicted it from the shared disk), as the engine's
        # scheduler takes it.
        return KVAdmission(allocation.num_reused_tokens, allocation, host, disk)

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
        """True when `count` more tokens have pages or can get them (commits first)."""
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

    def _finish(self, request: SimRequest) -> None:
        self.retry_reserve = True
        self.running.remove(request)
        self.manager.finish_request(request.request_id)
        self.on_finished(request)

    def _fail(self, request: SimRequest) -> None:
        """Drop a request that cannot fit on this rank even alone."""
        self.onboard_ahead.forget(request.request_id)
        self.release_hold_of(ahead_key(request.request_id))
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
