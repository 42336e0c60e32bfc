"""The KV cache manager: the only writer of page tables, pools and conversation retention.

An engine (or a simulator, with the same calls and no tensors) drives one request like this:

    manager.add_request("r1", prompt_ids, conversation_id="c1")   # hashes the prompt once
    match = manager.match("r1")                                    # read only
    if manager.can_admit("r1", chunk):   manager.admit("r1", chunk)      # refs the match
    manager.commit("r1", num_computed_tokens)                      # after each forward pass
    if manager.can_allocate("r1", n):    manager.allocate("r1", n)       # next chunk / decode
    manager.append_tokens("r1", sampled_ids)                       # so output blocks hash
    manager.finish_context("r1")                                   # prompt end: retain, drop
    manager.finish_request("r1")                                   # end or cancel

Checks come paired with actions and an action either does all of its work or raises before
touching anything. Not thread-safe: one scheduler thread owns the manager. Its helpers
(`admission`, `slide_out`, `retention`) change only the state and pools it hands them.

A conversation's retained turns end in one of two ways: `drop_conversation(cid)` when it has
ended (pages nobody else holds are freed) or, under memory pressure,
`release_conversation(cid)` (they become evictable: matchable until evicted, offloaded then).

With tiers (`kvfleet.kvstore.tiers`), a match also finds blocks on host or disk, admission
onboards them before it returns, evicted device pages are offloaded to host, and
`prefetch(waiting_request_ids)` reads queued requests' disk blocks to host in the background.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np
from kvfleet.kvstore.admission import (
    blocks_for,
    computed_blocks,
    match_fits,
    pages_fit,
    staged_match,
    take_computed,
    take_match,
)
from kvfleet.kvstore.block_pool import NULL_PAGE, BlockPool
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.events import KVEventListener, ignore_event
from kvfleet.kvstore.hashing import SequenceHashes
from kvfleet.kvstore.matching import find_prefix
from kvfleet.kvstore.request_state import RequestState
from kvfleet.kvstore.results import (
    Allocation,
    DropPlan,
    PrefixMatch,
    RequestProgress,
    TurnRecord,
    TurnRelease,
)
from kvfleet.kvstore.retention import (
    RetainedTurns,
    drop_turn,
    release_turn,
    retain_branch,
    retain_turn,
)
from kvfleet.kvstore.slide_out import (
    commit_computed,
    plan_commits,
    release_kept,
    release_slid_out,
)
from kvfleet.kvstore.tiers.metrics import DISK
from kvfleet.kvstore.tiers.stack import KVTiers


class UnknownRequestError(KeyError):
    """A call named a request the manager does not track."""


class KVCacheManager:
    """Paged KV cache index and allocator over one pool per life cycle."""

    def __init__(
        self,
        config: KVStoreConfig,
        listener: KVEventListener = ignore_event,
        tiers: KVTiers | None = None,
    ) -> None:
        self.config = config
        self.life_cycles = {lc.name: lc for lc in config.life_cycles}
        self.tiers = tiers or KVTiers.device_only(list(self.life_cycles))
        pool_listener = self.tiers.attach(listener, self._on_device)
        self.pools: Mapping[str, BlockPool] = {
            name: BlockPool(
                name,
                config.pool_pages[name],
                pool_listener,
                partial(self.tiers.on_device_evict, name),
            )
            for name in self.life_cycles
        }
        self._locate = self.tiers.locate if self.tiers.has_lower_tiers else None
        self._requests: dict[str, RequestState] = {}
        self._conversations: dict[str, RetainedTurns] = {}

    # -- reads ---------------------------------------------------------------------------------

    def match(self, request_id: str) -> PrefixMatch:
        """The longest reusable prefix of the request's prompt now (no mutation)."""
        state = self._state(request_id)
        cap_tokens = state.prompt_len - max(1, self.config.max_replay_tokens)
        return find_prefix(
            state.sequence.hashes,
            max(0, cap_tokens) // self.config.block_size,
            self.config.life_cycles,
            self.pools,
            self.config.block_size,
            self._locate,
        )

    def page_table(self, request_id: str, life_cycle: str) -> tuple[int, ...]:
        """The request's pages of one life cycle in token order; NULL_PAGE where slid out."""
        if life_cycle not in self.life_cycles:
            raise ValueError(f"unknown life cycle {life_cycle!r}; known: {list(self.life_cycles)}")
        return tuple(self._state(request_id).page_tables.get(life_cycle, ()))

    def progress(self, request_id: str) -> RequestProgress:
        """Where the request stands: admitted, reused, computed, checkpoint, context done."""
        state = self._state(request_id)
        return RequestProgress(
            state.admitted,
            state.num_reused_tokens,
            state.num_computed_tokens,
            state.checkpoint_tokens,
            state.context_done,
            state.branch_tokens,
        )

    def retained_turns(self, conversation_id: str) -> tuple[TurnRecord, ...]:
        """Records the conversation holds: a kept root, branch records, then turns oldest first."""
        turns = self._conversations.get(conversation_id)
        return turns.in_order() if turns is not None else ()

    def request_ids(self) -> tuple[str, ...]:
        """Requests being tracked."""
        return tuple(self._requests)

    # -- request life ----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        conversation_id: str | None = None,
        extra_key: bytes = b"",
    ) -> None:
        """Start tracking a request and hash its prompt's full blocks."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already tracked")
        sequence = SequenceHashes(self.config.block_size, extra_key)
        sequence.extend(prompt_token_ids)
        if sequence.num_tokens == 0:
            raise ValueError(f"request {request_id!r} has an empty prompt")
        self._requests[request_id] = RequestState(
            request_id, conversation_id, sequence.num_tokens, sequence
        )

    def can_admit(self, request_id: str, num_new_tokens: int) -> bool:
        """True if `admit(request_id, num_new_tokens)` would succeed now."""
        if self._state(request_id).admitted:
            return False
        return self._fits(self.match(request_id), num_new_tokens)

    def admit(self, request_id: str, num_new_tokens: int) -> Allocation:
        """Take the matched prefix and pages for the first `num_new_tokens` tokens after it."""
        self._check_tokens(num_new_tokens)
        if not self.can_admit(request_id, num_new_tokens):
            raise ValueError(f"request {request_id!r} cannot be admitted for {num_new_tokens}")
        state = self._state(request_id)
        self.tiers.land_prefetched()
        match, staged = staged_match(
            partial(self.match, request_id), self.tiers, state.sequence.hashes
        )
        try:
            if not self._fits(match, num_new_tokens):
                raise ValueError(f"request {request_id!r}: its match shrank and no longer fits")
            take_match(state, match, staged, self.pools, self.life_cycles, self.tiers)
        finally:
            self.tiers.release_pins()
        state.admitted = True
        state.num_reused_tokens = state.num_computed_tokens = match.num_reusable_tokens
        whole_prefix_tokens = match.num_whole_prefix_blocks * self.config.block_size
        plan_commits(state, self.life_cycles, self.config, whole_prefix_tokens)
        return self.allocate(request_id, num_new_tokens)

    def can_admit_computed(self, request_id: str) -> bool:
        """True if `admit_computed(request_id)` would succeed now."""
        state = self._state(request_id)
        return not state.admitted and self._computed_fits(state, self.match(request_id))

    def admit_computed(self, request_id: str) -> Allocation:
        """Admit a prompt whose KV was computed elsewhere (a hand-off): take the matched prefix
        and pages only for the blocks after it that decoding reads or the reuse policy commits
        (`admission.computed_blocks`), NULL_PAGE at the others.

        The caller writes those pages' bytes, then calls `commit(request_id, prompt_len)`.
        NOTE: no branch point is planned: its window was computed elsewhere and may not come.
        """
        if not self.can_admit_computed(request_id):
            raise ValueError(f"request {request_id!r} cannot be admitted as computed elsewhere")
        state = self._state(request_id)
        self.tiers.land_prefetched()
        match, staged = staged_match(
            partial(self.match, request_id), self.tiers, state.sequence.hashes
        )
        try:
            if not self._computed_fits(state, match):
                raise ValueError(f"request {request_id!r}: its match shrank and no longer fits")
            take_match(state, match, staged, self.pools, self.life_cycles, self.tiers)
        finally:
            self.tiers.release_pins()
        state.admitted = True
        state.num_reused_tokens = state.num_computed_tokens = match.num_reusable_tokens
        plan_commits(state, self.life_cycles, self.config)
        blocks = computed_blocks(
            self.life_cycles, self.config, state.prompt_len, state.num_reused_tokens
        )
        num_blocks = self._blocks_for(state.prompt_len)
        new_pages = take_computed(state, blocks, self.pools, num_blocks)
        self.tiers.flush()
        return Allocation(
            request_id, state.num_reused_tokens, num_blocks * self.config.block_size, new_pages
        )

    def can_allocate(self, request_id: str, num_new_tokens: int) -> bool:
        """True if `allocate(request_id, num_new_tokens)` would succeed now."""
        state = self._state(request_id)
        if not state.admitted:
            return False
        blocks_after = self._blocks_for(state.num_computed_tokens + num_new_tokens)
        return all(
            max(0, blocks_after - len(state.page_tables[name])) <= pool.num_available()
            for name, pool in self._required_pools()
        )

    def allocate(self, request_id: str, num_new_tokens: int) -> Allocation:
        """Pages for tokens [computed, computed + new); optional life cycles are best-effort."""
        self._check_tokens(num_new_tokens)
        if not self.can_allocate(request_id, num_new_tokens):
            raise ValueError(f"request {request_id!r} cannot allocate {num_new_tokens} tokens")
        state = self._state(request_id)
        blocks_after = self._blocks_for(state.num_computed_tokens + num_new_tokens)
        new_pages: dict[str, tuple[int, ...]] = {}
        for name, pool in self.pools.items():
            table = state.page_tables[name]
            needed = max(0, blocks_after - len(table))
            pages = pool.take(min(needed, pool.num_available()))
            table.extend(pages)
            table.extend([NULL_PAGE] * (needed - len(pages)))  # only optional ones fall short
            new_pages[name] = tuple(pages)
        self.tiers.flush()
        return Allocation(
            request_id,
            state.num_reused_tokens,
            len(next(iter(state.page_tables.values()))) * self.config.block_size,
            new_pages,
        )

    def append_tokens(self, request_id: str, token_ids: Sequence[int] | np.ndarray) -> None:
        """Extend the request's sequence with generated tokens, so their blocks can commit."""
        self._state(request_id).sequence.extend(token_ids)

    def commit(self, request_id: str, num_computed_tokens: int) -> None:
        """Record computed tokens: commit full blocks per policy, release slid-out pages."""
        state = self._state(request_id)
        limit = len(next(iter(state.page_tables.values()), [])) * self.config.block_size
        if not state.admitted or not state.num_computed_tokens <= num_computed_tokens <= limit:
            raise ValueError(
                f"request {request_id!r}: computed tokens must go from "
                f"{state.num_computed_tokens} up to {limit} (with pages), got {num_computed_tokens}"
            )
        state.num_computed_tokens = num_computed_tokens
        num_hashed = min(num_computed_tokens, state.sequence.num_tokens) // self.config.block_size
        every_block = self.config.reuse_policy.commits_every_block
        commit_computed(state, self.pools, self.life_cycles, num_hashed, every_block)
        self._release_slid_out(state)

    def finish_context(self, request_id: str) -> tuple[DropPlan, ...]:
        """At the prompt end: retain this turn's endpoints, drop turns beyond the policy's count."""
        state = self._state(request_id)
        if state.context_done or state.num_computed_tokens < state.prompt_len:
            raise ValueError(
                f"request {request_id!r}: context end needs {state.prompt_len} computed tokens, "
                f"has {state.num_computed_tokens} (done already: {state.context_done})"
            )
        state.context_done = True
        release_kept(state, self.pools)
        self._release_slid_out(state)
        policy = self.config.reuse_policy
        if not policy.retained_turns or state.conversation_id is None:
            return ()
        turns = self._conversations.setdefault(state.conversation_id, RetainedTurns())
        turn = retain_turn(state, self.pools, self.life_cycles, self.config.block_size)
        fallen = turns.add(turn, policy.recent_turns, policy.keep_root)
        fallen.extend(self._retain_branch(state, turns))
        return tuple(
            plan for old in fallen for plan in drop_turn(old, self.pools, self.life_cycles)
        )

    def finish_request(self, request_id: str) -> None:
        """Release every page the request holds (at its end or on cancel) and forget it."""
        state = self._state(request_id)
        for name, table in state.page_tables.items():
            pool = self.pools[name]
            for page in table:
                if page != NULL_PAGE:
                    pool.release(page)
        del self._requests[request_id]

    def prefetch(self, waiting_request_ids: Sequence[str]) -> int:
        """Read the disk blocks of the first `disk_prefetch_num_reqs` waiting requests to host
        in the background (others in flight are cancelled); returns the reads queued.

        Finished reads land on host here, at `admit`, or at `land_prefetched`.
        """
        self.tiers.land_prefetched()
        keys: list[tuple[str, int]] = []
        for request_id in waiting_request_ids[: self.tiers.disk_prefetch_num_reqs]:
            state = self._state(request_id)
            if state.admitted:
                continue
            hashes = state.sequence.hashes
            for name, where in self.match(request_id).locations.items():
                keys.extend((name, hashes[i]) for i, tier in enumerate(where) if tier == DISK)
        return self.tiers.prefetch(keys)

    def land_prefetched(self) -> int:
        """Put finished background disk reads on the host tier; returns how many landed."""
        return self.tiers.land_prefetched()

    def drop_conversation(self, conversation_id: str) -> tuple[DropPlan, ...]:
        """Release every retained turn of a conversation that has ended."""
        turns = self._conversations.pop(conversation_id, RetainedTurns())
        return tuple(
            plan
            for turn in turns.in_order()
            for plan in drop_turn(turn, self.pools, self.life_cycles)
        )

    def can_release_conversation(self, conversation_id: str) -> bool:
        """True if `release_conversation(conversation_id)` would succeed: it retains turns."""
        turns = self._conversations.get(conversation_id)
        return turns is not None and bool(turns.in_order())

    def release_conversation(self, conversation_id: str) -> tuple[TurnRelease, ...]:
        """Hand a conversation's retained-turn refs to the LRU (memory pressure; it goes on).

        Unlike `drop_conversation` nothing is freed: pages nobody else holds become evictable,
        stay matchable until evicted, and are offloaded by the tiers when they are.
        """
        if not self.can_release_conversation(conversation_id):
            raise ValueError(f"conversation {conversation_id!r} retains no turns to release")
        turns = self._conversations.pop(conversation_id)
        return tuple(release_turn(turn, self.pools) for turn in turns.in_order())

    # -- invariants ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every pool's counts and ref counts match its holders."""
        holders: dict[str, Counter[int]] = {name: Counter() for name in self.pools}
        for state in self._requests.values():
            for name, table in state.page_tables.items():
                holders[name].update(page for page in table if page != NULL_PAGE)
        for turns in self._conversations.values():
            for turn in turns.in_order():
                for name, pages in turn.pages.items():
                    holders[name].update(page for page in pages if page is not None)
        for name, pool in self.pools.items():
            pool.check_integrity(holders[name])
        self.tiers.check_integrity()

    # -- internals -------------------------------------------------------------------------------

    def _state(self, request_id: str) -> RequestState:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

    def _on_device(self, life_cycle: str, block_hash: int) -> bool:
        return self.pools[life_cycle].lookup(block_hash) is not None

    def _fits(self, match: PrefixMatch, num_new_tokens: int) -> bool:
        return match_fits(match, num_new_tokens, self._required_pools(), self.config.block_size)

    def _computed_fits(self, state: RequestState, match: PrefixMatch) -> bool:
        blocks = computed_blocks(
            self.life_cycles, self.config, state.prompt_len, match.num_reusable_tokens
        )
        counts = {name: len(indices) for name, indices in blocks.items()}
        return pages_fit(match, counts, self._required_pools())

    def _blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.config.block_size)

    @staticmethod
    def _check_tokens(num_new_tokens: int) -> None:
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")

    def _required_pools(self) -> list[tuple[str, BlockPool]]:
        return [(n, p) for n, p in self.pools.items() if self.life_cycles[n].required]

    def _retain_branch(self, state: RequestState, turns: RetainedTurns) -> list[TurnRecord]:
        """Hold the request's branch point, or mark the branch it resumed at as recently used;
        the branch records that fell out (for the caller to drop)."""
        bs, keep = self.config.block_size, self.config.reuse_policy.keep_branch_points
        if state.branch_tokens is not None:
            key, branch = retain_branch(state, self.pools, self.life_cycles, bs)
            return turns.add_branch(key, branch, keep)
        if state.num_reused_tokens:
            turns.touch_branch(state.sequence.hashes[state.num_reused_tokens // bs - 1])
        return []

    def _release_slid_out(self, state: RequestState) -> None:
        """Release the pages that slid out of the request's windows since the last commit."""
        release_slid_out(state, self.pools, self.life_cycles, self.config.block_size)
