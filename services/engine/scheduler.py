"""Continuous batching with chunked prefill under a per-step token budget.

Each step: running sequences first (decodes and unfinished prefills, oldest first), then
waiting ones are admitted into free slots while budget is left. A prefill chunk starts after
the reused prefix (the kvstore match), so cached tokens are never recomputed. The scheduler
runs on the engine core's thread and is the only caller of the kvstore manager there.

When pages run short it first releases the retained turns of the conversation that ended a
context longest ago (to the LRU: evictable, offloaded to host/disk by the tiers when evicted,
still matchable until then), then preempts the newest running sequence (recompute: it is
re-added with its output so far and resumes from whatever prefix is still cached).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from kvfleet.kvstore.manager import KVCacheManager

from .sequence import Sequence


@dataclass(frozen=True)
class ScheduledChunk:
    """One sequence's share of a step: tokens [start, start + len(new_tokens)) and its pages."""

    sequence: Sequence
    start: int
    new_tokens: tuple[int, ...]
    page_ids: Mapping[str, tuple[int, ...]]

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the last known token, so its logits give the next one."""
        return self.start + len(self.new_tokens) == self.sequence.num_tokens


class Scheduler:
    """Waiting queue, running set and the step plan, over one kvstore manager."""

    def __init__(self, manager: KVCacheManager, max_batch_size: int, token_budget: int) -> None:
        self.manager = manager
        self.max_batch_size = max_batch_size
        self.token_budget = token_budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        # Conversations by their last context end, oldest first: who gives pages back first.
        self._retained: OrderedDict[str, None] = OrderedDict()

    # -- membership ------------------------------------------------------------------------------

    def add(self, sequence: Sequence) -> None:
        """Queue a sequence and let the manager hash its prompt."""
        self.manager.add_request(sequence.key, sequence.prompt, sequence.call.conversation_id)
        sequence.kv_prompt_len = len(sequence.prompt)
        self.waiting.append(sequence)

    def remove(self, sequence: Sequence) -> None:
        """Forget a finished or cancelled sequence and release every page it holds."""
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)
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
        return self._release_retained(fits)

    def context_ended(self, sequence: Sequence) -> None:
        """Tell the manager the prompt is computed: retain this turn, drop older ones."""
        sequence.context_done = True
        if not sequence.retain:
            return
        self.manager.finish_context(sequence.key)
        conversation = sequence.call.conversation_id
        if conversation and self.manager.retained_turns(conversation):
            self._retained[conversation] = None
            self._retained.move_to_end(conversation)

    def retained_pages(self) -> int:
        """Distinct pages the retained turns of every conversation hold."""
        pages = {
            (name, page)
            for conversation in self._retained
            for turn in self.manager.retained_turns(conversation)
            for name, turn_pages in turn.pages.items()
            for page in turn_pages
            if page is not None
        }
        return len(pages)

    @property
    def num_sequences(self) -> int:
        return len(self.running) + len(self.waiting)

    # -- the step plan -----------------------------------------------------------------------------

    def schedule(self) -> list[ScheduledChunk]:
        """Pick this step's chunks and allocate their pages; empty when nothing can run."""
        # Queued requests' disk blocks head for host in the background; finished reads land.
        self.manager.prefetch([sequence.key for sequence in self.waiting])
        budget = self.token_budget
        chunks: list[ScheduledChunk] = []
        for sequence in list(self.running):
            if budget == 0:
                break
            if sequence not in self.running:
                continue  # preempted while making room for an older one
            start = self.manager.progress(sequence.key).num_computed_tokens
            count = min(sequence.num_tokens - start, budget)
            scheduled = {chunk.sequence for chunk in chunks}
            if count <= 0 or not self._make_room(sequence, count, scheduled):
                continue
            self.manager.allocate(sequence.key, count)
            chunks.append(self._chunk(sequence, start, count))
            budget -= count
        budget = self._admit(chunks, budget)
        return chunks

    def _admit(self, chunks: list[ScheduledChunk], budget: int) -> int:
        for sequence in list(self.waiting):
            if budget == 0 or len(self.running) >= self.max_batch_size:
                break
            if not sequence.ready():
                continue
            match = self.manager.match(sequence.key)
            count = min(sequence.num_tokens - match.num_reusable_tokens, budget)
            if not self.manager.can_admit(sequence.key, count) and not self._release_retained(
                lambda s=sequence, c=count: self.manager.can_admit(s.key, c)
            ):
                break  # first come, first served: later ones wait behind it
            # NOTE: admission onboards host/disk blocks and may reuse less than the match said
            # (a disk file that failed its checks); the chunk starts where reuse really ends.
            reused = self.manager.admit(sequence.key, count).num_reused_tokens
            self.waiting.remove(sequence)
            self.running.append(sequence)
            sequence.admitted = True
            if sequence.cached_tokens is None:
                sequence.cached_tokens = reused
            chunks.append(self._chunk(sequence, reused, count))
            budget -= count
        return budget

    def _chunk(self, sequence: Sequence, start: int, count: int) -> ScheduledChunk:
        pages = {
            name: self.manager.page_table(sequence.key, name) for name in self.manager.life_cycles
        }
        return ScheduledChunk(sequence, start, tuple(sequence.tokens(start, start + count)), pages)

    # -- memory pressure ---------------------------------------------------------------------------

    def _make_room(self, sequence: Sequence, count: int, scheduled: set[Sequence]) -> bool:
        """Make `allocate(sequence, count)` possible: release retained turns, then preempt.

        Sequences already planned this step are never preempted (their pages are in use).
        """

        def fits() -> bool:
            return self.manager.can_allocate(sequence.key, count)

        if fits() or self._release_retained(fits):
            return True
        while not fits():
            victims = [s for s in self.running if s is not sequence and s not in scheduled]
            if not victims:
                return False
            self._preempt(victims[-1])
        return True

    def _release_retained(self, fits) -> bool:
        """Release whole conversations' retained turns to the LRU, oldest first, until `fits()`.

        NOTE: release, not drop: the conversation may come back, and its pages stay matchable
        (and go to host/disk on eviction) instead of being freed.
        """
        while self._retained:
            conversation, _ = self._retained.popitem(last=False)
            if self.manager.can_release_conversation(conversation):
                self.manager.release_conversation(conversation)
            if fits():
                return True
        return False

    def _preempt(self, victim: Sequence) -> None:
        """Give back a running sequence's pages; it re-queues first with its output so far."""
        self.running.remove(victim)
        self.manager.finish_request(victim.key)
        tokens = victim.tokens(0, victim.num_tokens)
        self.manager.add_request(victim.key, tokens, victim.call.conversation_id)
        victim.kv_prompt_len = len(tokens)
        victim.retain = victim.retain and not victim.context_done
        victim.admitted = False
        self.waiting.appendleft(victim)
        self.preemptions += 1
