"""Continuous batching with chunked prefill under a per-step token budget.

Each step: running sequences first (decodes and unfinished prefills, oldest first), then
waiting ones are admitted into free slots while budget is left. A prefill chunk starts after
the reused prefix (the kvstore match), so cached tokens are never recomputed. The scheduler
runs on the engine core's thread and is the only caller of the kvstore manager there.

The rule itself (running first, admission first come first served, memory pressure: release
the oldest retained conversation to the LRU, then preempt the newest running sequence) is
`StepPlanner`'s, shared with the simulator; this class makes its chunks (scheduled_chunk.py).
A preempted sequence is re-added with its output so far and resumes from whatever prefix is
still cached.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ....kvstore.admission import MatchShrankError
from ....kvstore.manager import KVCacheManager
from ....kvstore.tiers.metrics import DEVICE
from ...core.step_planner import StepPlanner
from ..request.scheduled_chunk import ScheduledChunk
from ..request.sequence import Sequence
from .prefetch_holds import PrefetchHolds

# Blocks brought up ahead of an admission are held this long at most (the sequence may be
# cancelled meanwhile); memory pressure gives them up before any sequence is preempted.
AHEAD_HOLD_SECONDS = 30.0


class Scheduler(StepPlanner[Sequence, ScheduledChunk]):
    """Waiting queue, running set and the step plan of sequences, over one kvstore manager."""

    def __init__(
        self,
        manager: KVCacheManager,
        max_batch_size: int,
        token_budget: int,
        onboard_pages_per_step: int = 0,
    ) -> None:
        super().__init__(manager, max_batch_size, token_budget)
        self.holds = PrefetchHolds(manager)  # router-driven prefetch between turns
        # A prefix with more host/disk blocks than this, admitted while others run, comes up
        # this many a step before its admission (`_onboard_ahead`); 0: all at its admission.
        self.onboard_pages_per_step = onboard_pages_per_step
        self.onboarded_ahead = 0  # pages brought up ahead of admissions
        self._ahead: dict[str, AheadPlan] = {}  # sequence key -> its pieces' plan
        self._ahead_ids = itertools.count()

    # -- membership ------------------------------------------------------------------------------

    def add(self, sequence: Sequence) -> None:
        """Queue a sequence and let the manager hash its prompt."""
        self._track(sequence, sequence.prompt)
        sequence.kv_prompt_len = len(sequence.prompt)
        self.waiting.append(sequence)

    def remove(self, sequence: Sequence) -> None:
        """Forget a finished or cancelled sequence and release every page it holds."""
        self.park(sequence)
        self.holds.release(_ahead_key(sequence))
        self._drop_plan(sequence.key)
        if sequence.key in self.manager.request_ids():
            self.manager.finish_request(sequence.key)

    def park(self, sequence: Sequence) -> None:
        """Stop running a sequence but keep its pages (a hand-off holds them)."""
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)

    def adopt(self, sequence: Sequence) -> None:
        """Run a sequence the manager already admitted (its KV arrived by hand-off)."""
        sequence.kv_prompt_len = len(sequence.prompt)
        self.running.append(sequence)

    def release_retained_until(self, fits) -> bool:
        """Release retained conversations, oldest first, until `fits()`; False if it never does."""
        return self.retained.release_until(fits)

    def retained_pages(self) -> int:
        """Distinct pages the retained turns of every conversation hold."""
        return self.manager.retained_page_count()

    @property
    def num_sequences(self) -> int:
        return len(self.running) + len(self.waiting)

    # -- the step plan -----------------------------------------------------------------------------

    def schedule(self) -> list[ScheduledChunk]:
        """Pick this step's chunks and allocate their pages; empty when nothing can run."""
        self.manager.land_prefetched()  # finished reads are on host before anything matches
        self.holds.expire()
        chunks = self.plan_step()
        # NOTE: the disk blocks of the requests still waiting after this step's admissions head
        # for host in the background. Chosen before the admissions, the reads went to requests
        # admitted in this very step (which read their blocks at admission): on an idle rank
        # the requests behind the first ones started their reads a step late.
        self.manager.prefetch([sequence.key for sequence in self.waiting])
        return chunks

    def context_ended(self, item: Sequence) -> None:
        super().context_ended(item)
        self.holds.remember(item.conversation_id, item.prompt, item.call.extra_key)

    def _free_for(self, fits: Callable[[], bool], keep: str | None = None) -> bool:
        # Retained turns go first, then held prefetches; only then is anything preempted.
        return self.retained.fits_or_release(fits) or self.holds.cancel_until(fits, keep)

    def _next_count(self, sequence: Sequence, budget: int) -> int:
        start = self.manager.progress(sequence.key).num_computed_tokens
        return min(sequence.num_tokens - start, budget)

    def _fits(self, sequence: Sequence, count: int) -> bool:
        return self.manager.can_allocate(sequence.key, count)

    def _grow(self, sequence: Sequence, count: int) -> ScheduledChunk:
        start = self.manager.progress(sequence.key).num_computed_tokens
        self.manager.allocate(sequence.key, count)
        return self._chunk(sequence, start, count)

    def _grow_all(self, budget: int) -> list[ScheduledChunk] | None:
        # A decode step of the whole batch: one kvstore call for every sequence's next page,
        # the per-sequence path's plan when all of them fit (nothing to release or preempt).
        running = self.running
        if not running or len(running) > budget:
            return None
        keys = [sequence.key for sequence in running]
        starts = self.manager.computed_tokens(keys)
        for sequence, start in zip(running, starts, strict=True):
            if sequence.num_tokens - start != 1:
                return None
        if self.manager.try_allocate_all(keys, 1) is None:
            return None
        one_token, pages = ScheduledChunk.one_token, self._pages
        return [
            one_token(sequence, start, sequence.token_at(start), partial(pages, sequence.key))
            for sequence, start in zip(running, starts, strict=True)
        ]

    def _ready(self, sequence: Sequence) -> bool:
        return sequence.ready()

    def _admit(self, sequence: Sequence, budget: int) -> ScheduledChunk | None:
        if self._onboard_ahead(sequence):
            return None  # its next blocks came up this step; the running ones step meanwhile
        match = self.manager.match(sequence.key)
        count = min(sequence.num_tokens - match.num_reusable_tokens, budget)
        conversation = sequence.conversation_id
        if not self._free_for(lambda: self.manager.can_admit(sequence.key, count), conversation):
            return None
        # NOTE: admission onboards host/disk blocks and may reuse less than the match said
        # (a disk file that failed its checks); the chunk starts where reuse really ends.
        try:
            reused = self.manager.admit(sequence.key, count).num_reused_tokens
        except MatchShrankError:
            return None  # what is left of its match did not fit: it waits, and matches again
        self.holds.take(conversation)  # the sequence holds the pages now
        self.holds.release(_ahead_key(sequence))
        self._drop_plan(sequence.key)  # admitted beside a piece still waiting for room
        sequence.admitted = True
        if sequence.cached_tokens is None:
            sequence.cached_tokens = reused
        return self._chunk(sequence, reused, count)

    def _onboard_ahead(self, sequence: Sequence) -> bool:
        """Bring the next `onboard_pages_per_step` host/disk blocks of the sequence's match up
        to the device, held for it, when it would otherwise onboard more than that at its
        admission while other sequences run (they wait for an admission: every page onboarded
        in one go is a pause of the whole batch). True when blocks came up: the sequence is
        admitted at a later step, once the rest fit in one piece.

        The blocks to bring up are read from the match once (`AheadPlan`); a piece is a hold
        (`PrefetchHolds.keep`) of the prompt up to the block after its last one, so it reuses
        what the previous piece brought up. The admission itself is the ordinary one: it finds
        those blocks on the device, or onboards whatever is not. Room is made as for the
        admission (retained turns released, then other holds); where none can be made the
        plan and the piece's request are kept for the next step (a waiting request is asked
        every step: planning again would walk its whole prefix each time), and the admission
        goes as before; a piece that brings nothing up ends the plan.
        """
        step = self.onboard_pages_per_step
        if step <= 0 or not self.running:
            self._drop_plan(sequence.key)
            return False
        manager = self.manager
        plan = self._ahead.get(sequence.key)
        if plan is None:
            plan = self._ahead[sequence.key] = AheadPlan(
                manager.match(sequence.key).lower_positions()
            )
        if len(plan.lower) - plan.done <= step:
            self._drop_plan(sequence.key)
            return False  # the admission brings the rest up
        if plan.piece is None:
            config = manager.config
            end_tokens = (plan.lower[plan.done + step - 1] + 1) * config.block_size
            end_tokens += max(1, config.max_replay_tokens)  # a match stops this far before the end
            plan.piece = f"onboard-ahead-{next(self._ahead_ids)}"
            manager.add_prefix_request(plan.piece, sequence.key, end_tokens)
        piece = plan.piece
        if manager.match(piece).num_reusable_tokens == 0:
            self._drop_plan(sequence.key)
            return False
        if not self._free_for(partial(manager.can_admit, piece, 0), _ahead_key(sequence)):
            return False  # no room yet: the plan and its piece wait for the next step
        before = manager.tiers.metrics[DEVICE].pages_in
        try:
            manager.admit(piece, 0)
        except MatchShrankError:  # the admission onboards what is left
            self._drop_plan(sequence.key)
            return False
        plan.piece = None  # the hold owns it now
        self.holds.keep(_ahead_key(sequence), piece, AHEAD_HOLD_SECONDS)
        brought = manager.tiers.metrics[DEVICE].pages_in - before
        self.onboarded_ahead += brought
        plan.done += step
        if not brought:
            self._drop_plan(sequence.key)
        return brought > 0

    def _drop_plan(self, key: str) -> None:
        """End a sequence's pieces' plan, forgetting a piece not yet held."""
        plan = self._ahead.pop(key, None)
        if plan is not None and plan.piece is not None:
            self.manager.finish_request(plan.piece)

    def _chunk(self, sequence: Sequence, start: int, count: int) -> ScheduledChunk:
        tokens = tuple(sequence.tokens(start, start + count))
        return ScheduledChunk(sequence, start, tokens, partial(self._pages, sequence.key))

    def _pages(self, key: str) -> dict[str, tuple[int, ...]]:
        # Read when a backend first asks, on this thread, before the step's commits.
        return {name: self.manager.page_table(key, name) for name in self.manager.life_cycles}

    # -- preemption ------------------------------------------------------------------------------

    def _recompute_tokens(self, victim: Sequence) -> list[int]:
        return victim.tokens(0, victim.num_tokens)

    def _extra_key(self, item: Sequence) -> bytes:
        return item.call.extra_key

    def _branch_hints(self, item: Sequence) -> tuple[int, ...]:
        return item.call.branch_hints

    def _on_preempted(self, victim: Sequence, num_tokens: int) -> None:
        victim.kv_prompt_len = num_tokens
        victim.admitted = False


@dataclass
class AheadPlan:
    """A waiting sequence's pieces: its match's host/disk block positions, how many of them
    are brought up, and the next piece's prefix request while it waits for room."""

    lower: list[int]
    done: int = 0
    piece: str | None = None


def _ahead_key(sequence: Sequence) -> str:
    """What the blocks brought up ahead of a sequence's admission are held under."""
    return f"admit-ahead:{sequence.key}"
