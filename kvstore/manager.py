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
touching anything. Not thread-safe: one scheduler thread owns the manager.

A conversation's retained turns end in one of two ways: `drop_conversation(cid)` when it has
ended (pages nobody else holds are freed) or, under memory pressure,
`release_conversation(cid)` (they become evictable: matchable until evicted, offloaded then).

With tiers (`kvfleet.kvstore.tiers`), a match also finds blocks on host or disk, admission
onboards them before it returns, evicted device pages are offloaded to host, and
`prefetch(waiting_request_ids)` reads queued requests' disk blocks to host in the background.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np
from kvfleet.kvstore.block_pool import NULL_PAGE, BlockPool
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.drop_plan import build_drop_plan
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
from kvfleet.kvstore.tiers.metrics import DISK
from kvfleet.kvstore.tiers.onboarding import onboard_staged
from kvfleet.kvstore.tiers.stack import KVTiers, StagedBlock, StaleMatchError


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
        self._conversations: dict[str, deque[TurnRecord]] = {}

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
        )

    def retained_turns(self, conversation_id: str) -> tuple[TurnRecord, ...]:
        """Turns whose endpoints the conversation holds, oldest first."""
        return tuple(self._conversations.get(conversation_id, ()))

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
        match, staged = self._staged_match(request_id)
        try:
            if not self._fits(match, num_new_tokens):
                raise ValueError(f"request {request_id!r}: its match shrank and no longer fits")
            for name, pages in match.pages.items():
                for page in pages:
                    if page != NULL_PAGE:
                        self.pools[name].ref(page)
                self.tiers.count_device_hits(sum(page != NULL_PAGE for page in pages))
                state.page_tables[name] = list(pages)
                state.next_commit[name] = match.num_reusable_blocks
                state.next_release[name] = 0
            onboard_staged(self.tiers, self.pools, self.life_cycles, state.page_tables, staged)
        finally:
            self.tiers.release_pins()
        state.admitted = True
        state.num_reused_tokens = state.num_computed_tokens = match.num_reusable_tokens
        self._plan_commits(state)
        return self.allocate(request_id, num_new_tokens)

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
        hashes = state.sequence.hashes
        every_block = self.config.reuse_policy.commits_every_block
        for name, life_cycle in self.life_cycles.items():
            if not life_cycle.reusable:
                continue
            pool, table = self.pools[name], state.page_tables[name]
            wanted = state.commit_blocks[name]
            for index in range(state.next_commit[name], num_hashed):
                if table[index] != NULL_PAGE and (
                    every_block or life_cycle.needs_whole_prefix or index in wanted
                ):
                    pool.commit(table[index], hashes[index])
            state.next_commit[name] = max(state.next_commit[name], num_hashed)
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
        self._release_kept(state)
        self._release_slid_out(state)
        keep = self.config.reuse_policy.retained_turns
        if not keep or state.conversation_id is None:
            return ()
        turns = self._conversations.setdefault(state.conversation_id, deque())
        turns.append(self._retain_turn(state))
        plans = []
        while len(turns) > keep:
            plans.extend(self._apply_drop(turns.popleft()))
        return tuple(plans)

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
        turns = self._conversations.pop(conversation_id, deque())
        return tuple(plan for turn in turns for plan in self._apply_drop(turn))

    def can_release_conversation(self, conversation_id: str) -> bool:
        """True if `release_conversation(conversation_id)` would succeed: it retains turns."""
        return bool(self._conversations.get(conversation_id))

    def release_conversation(self, conversation_id: str) -> tuple[TurnRelease, ...]:
        """Hand a conversation's retained-turn refs to the LRU (memory pressure; it goes on).

        Unlike `drop_conversation` nothing is freed: pages nobody else holds become evictable,
        stay matchable until evicted, and are offloaded by the tiers when they are.
        """
        if not self.can_release_conversation(conversation_id):
            raise ValueError(f"conversation {conversation_id!r} retains no turns to release")
        turns = self._conversations.pop(conversation_id)
        return tuple(self._release_turn(turn) for turn in turns)

    # -- invariants ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every pool's counts and ref counts match its holders."""
        holders: dict[str, Counter[int]] = {name: Counter() for name in self.pools}
        for state in self._requests.values():
            for name, table in state.page_tables.items():
                holders[name].update(page for page in table if page != NULL_PAGE)
        for turns in self._conversations.values():
            for turn in turns:
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
        """True if every required pool has room for the new blocks and the onboarded ones."""
        blocks_after = self._blocks_for(match.num_reusable_tokens + num_new_tokens)
        for name, pool in self._required_pools():
            revived = sum(1 for page in match.pages[name] if pool.is_evictable(page))
            needed = blocks_after - match.num_reusable_blocks + match.num_lower(name)
            if needed > pool.num_available() - revived:
                return False
        return True

    def _staged_match(self, request_id: str) -> tuple[PrefixMatch, dict[str, list[StagedBlock]]]:
        """Match and stage its host/disk blocks; a bad disk file drops out and we match again."""
        while True:  # each retry has forgotten at least one disk block, so this ends
            match = self.match(request_id)
            try:
                return match, self.tiers.stage(match, self._state(request_id).sequence.hashes)
            except StaleMatchError:
                continue

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)

    @staticmethod
    def _check_tokens(num_new_tokens: int) -> None:
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")

    def _required_pools(self):
        return [(n, p) for n, p in self.pools.items() if self.life_cycles[n].required]

    def _plan_commits(self, state: RequestState) -> None:
        """Which window/state blocks to commit and keep: endpoint, snapshots, checkpoint."""
        bs, policy = self.config.block_size, self.config.reuse_policy
        checkpoint = self.config.checkpoint_position(state.prompt_len)
        enabled = policy.allows_checkpoint and self.config.checkpoint
        if enabled and checkpoint > state.num_reused_tokens:
            state.checkpoint_tokens = checkpoint
        end_blocks = state.prompt_len // bs
        for name, life_cycle in self.life_cycles.items():
            # NOTE: whole-prefix life cycles commit every full block anyway and never slide.
            if life_cycle.needs_whole_prefix:
                state.keep[name] = state.commit_blocks[name] = frozenset()
                continue
            wanted = set(life_cycle.resume_blocks(end_blocks, bs))
            if state.checkpoint_tokens is not None:
                wanted.update(life_cycle.resume_blocks(state.checkpoint_tokens // bs, bs))
            state.keep[name] = frozenset(wanted)
            state.commit_blocks[name] = frozenset(
                wanted | life_cycle.snapshot_blocks(state.prompt_len, bs)
            )

    def _release_slid_out(self, state: RequestState) -> None:
        """Release pages the running request no longer needs (kept ones wait for context end).

        Incremental: blocks below `next_release` were handled by an earlier call, so a decode
        commit costs the blocks that slid out since, not the whole context.
        """
        for name, life_cycle in self.life_cycles.items():
            first_live = life_cycle.first_live_block(
                state.num_computed_tokens, self.config.block_size
            )
            keep, table, pool = state.keep[name], state.page_tables[name], self.pools[name]
            for index in range(state.next_release[name], min(first_live, len(table))):
                if table[index] != NULL_PAGE and index not in keep:
                    pool.release(table[index])
                    table[index] = NULL_PAGE
            state.next_release[name] = max(state.next_release[name], first_live)

    def _release_kept(self, state: RequestState) -> None:
        """At context end: release kept blocks that slid out meanwhile, and keep nothing more."""
        for name, kept in state.keep.items():
            table, pool = state.page_tables[name], self.pools[name]
            # NOTE: ascending, so the LRU order is that of one sweep over the page table.
            for index in sorted(kept):
                if index < state.next_release[name] and table[index] != NULL_PAGE:
                    pool.release(table[index])
                    table[index] = NULL_PAGE
            state.keep[name] = frozenset()

    def _retain_turn(self, state: RequestState) -> TurnRecord:
        """Take a ref on every committed page needed to resume at the endpoint and checkpoint."""
        bs, hashes = self.config.block_size, state.sequence.hashes
        positions = [state.prompt_len // bs]
        if state.checkpoint_tokens is not None:
            positions.append(state.checkpoint_tokens // bs)
        pages: dict[str, tuple[int | None, ...]] = {}
        for name, life_cycle in self.life_cycles.items():
            if not life_cycle.reusable:
                continue
            indices = sorted({i for k in positions for i in life_cycle.resume_blocks(k, bs)})
            found = tuple(self.pools[name].lookup(hashes[index]) for index in indices)
            for page in found:
                if page is not None:
                    self.pools[name].ref(page)
            pages[name] = found
        return TurnRecord(state.conversation_id or "", state.request_id, pages)

    def _apply_drop(self, turn: TurnRecord) -> list[DropPlan]:
        """Release a turn's pages; free those nobody else holds (no plan: leave them to LRU)."""
        plan = build_drop_plan(turn, self.life_cycles, lambda n, p: self.pools[n].ref_count(p))
        self._release_turn(turn)
        if plan is None:
            return []
        for name, pages in plan.dropped.items():
            for page in pages:
                self.pools[name].drop(page)
        return [plan]

    def _release_turn(self, turn: TurnRecord) -> TurnRelease:
        """Give back a turn's refs; pages nobody else holds become evictable (the LRU's)."""
        released: dict[str, tuple[int, ...]] = {}
        evictable: dict[str, tuple[int, ...]] = {}
        for name, pages in turn.pages.items():
            pool = self.pools[name]
            released[name] = tuple(page for page in pages if page is not None)
            for page in released[name]:
                pool.release(page)
            evictable[name] = tuple(page for page in released[name] if pool.is_evictable(page))
        return TurnRelease(turn.conversation_id, turn.request_id, released, evictable)
