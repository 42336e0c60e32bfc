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
(`admission`, `matching`, `slide_out`, `retention`, `conversations`, `integrity`) change only the
state and pools it hands them.

A conversation's retained turns end in one of two ways: `drop_conversation(cid)` when it has
ended (pages nobody else holds are freed) or, under memory pressure,
`release_conversation(cid)` (they become evictable: matchable until evicted, offloaded then).

With tiers (`kvfleet.kvstore.tiers`), a match also finds blocks on host or disk, admission
onboards them before it returns, evicted device pages are offloaded to host, and
`prefetch(waiting_request_ids)` reads queued requests' disk blocks to host in the background.
A draining rank's `flush_retained_to_disk()` writes its retained turns' blocks to the shared
disk, so another rank resumes those conversations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np

from .admission import (
    admit_match,
    blocks_for,
    computed_fits,
    disk_blocks,
    match_fits,
    pages_demanded,
    tables_fit,
    take_computed,
    take_next,
)
from .block_pool import BlockPool
from .config import KVStoreConfig
from .conversations import ConversationRetention
from .events import KVEventListener, ignore_event
from .hashing import SequenceHashes, pack_tokens
from .integrity import check_pools
from .matching import match_prompt
from .request_state import RequestState
from .results import (
    Allocation,
    DropPlan,
    PrefixMatch,
    RequestProgress,
    TurnRecord,
    TurnRelease,
)
from .retention import cached_resume_blocks
from .slide_out import (
    commit_computed,
    plan_commits,
    release_kept,
    release_slid_out,
    release_tables,
)
from .table_changes import TableChanges, TableDelta
from .tiers.stack import KVTiers


class UnknownRequestError(KeyError):
    """A call named a request the manager does not track."""


class KVCacheManager:
    """Paged KV cache index and allocator over one pool per life cycle."""

    def __init__(
        self,
        config: KVStoreConfig,
        listener: KVEventListener = ignore_event,
        tiers: KVTiers | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        # The rank's clock: cache TTLs in every tier and retention times are measured on it.
        self.clock = clock
        self.life_cycles = {lc.name: lc for lc in config.life_cycles}
        # Only these release pages while a request runs (a commit skips the others).
        self._sliding = {name: lc for name, lc in self.life_cycles.items() if lc.slides}
        self.tiers = tiers or KVTiers.device_only(list(self.life_cycles))
        pool_listener = self.tiers.attach(listener, self._on_device, clock)
        evict = self.tiers.on_device_evict
        self.pools: Mapping[str, BlockPool] = {
            name: BlockPool(name, config.pool_pages[name], pool_listener, partial(evict, name))
            for name in self.life_cycles
        }
        self._locate = self.tiers.locate if self.tiers.has_lower_tiers else None
        self._requests: dict[str, RequestState] = {}
        self._conversations = ConversationRetention(
            self.pools, self.life_cycles, config.reuse_policy, config.block_size
        )
        self._changes: TableChanges | None = None  # kept once a reader watches the tables

    # -- reads ---------------------------------------------------------------------------------

    def match(self, request_id: str) -> PrefixMatch:
        """The longest reusable prefix of the request's prompt now (no mutation).

        An admission asks several times (its size, room, the admission itself) with nothing
        changed between, and a request waiting for room is asked every step: while no index
        the match read changed (the pools' hash indexes, the host and disk indexes; a shared
        disk folder's answer is trusted for a short window, `KVTiers.index_version`) the last
        match is handed out again, not walked again.
        """
        state = self._state(request_id)
        hashes = state.sequence.hashes
        version = self._index_version(len(hashes))
        last = state.last_match
        if last is not None and last[0] == version:
            return last[1]
        match = match_prompt(hashes, state.prompt_len, self.config, self.pools, self._locate)
        state.last_match = (version, match)
        return match

    def _index_version(self, num_hashes: int) -> tuple[int, ...]:
        """What a match reads, as counters that change whenever it may."""
        tiers = self.tiers.index_version()
        return (num_hashes, *tiers, *[pool.index_version for pool in self.pools.values()])

    def page_table(self, request_id: str, life_cycle: str) -> tuple[int, ...]:
        """The request's pages of one life cycle in token order; NULL_PAGE where slid out."""
        if life_cycle not in self.life_cycles:
            raise ValueError(f"unknown life cycle {life_cycle!r}; known: {list(self.life_cycles)}")
        return tuple(self._state(request_id).page_tables.get(life_cycle, ()))

    def watch_page_tables(self) -> Callable[[], TableDelta]:
        """Start recording which page-table entries change; the call returned hands out the
        changes since it was last called (`table_changes.py`), the admitted requests' whole
        tables the first time."""
        if self._changes is None:
            self._changes = TableChanges()
            for state in self._requests.values():
                self._changes.replaced(state)
        return self._take_table_changes

    def _take_table_changes(self) -> TableDelta:
        changes = self._changes
        assert changes is not None, "handed out by watch_page_tables, which starts the record"
        return changes.take(self._requests)

    def progress(self, request_id: str) -> RequestProgress:
        """Where the request stands: admitted, reused, computed, checkpoint, context done."""
        return self._state(request_id).progress()

    def computed_tokens(self, request_ids: Sequence[str]) -> list[int]:
        """Each request's computed tokens (`progress(r).num_computed_tokens`), in one call."""
        return [self._state(request_id).num_computed_tokens for request_id in request_ids]

    def retained_turns(self, conversation_id: str) -> tuple[TurnRecord, ...]:
        """Records the conversation holds: a kept root, branch records, then turns oldest first."""
        return self._conversations.records(conversation_id)

    def retained_page_count(self) -> int:
        """Distinct pages the retained turns of every conversation hold (recounted only after
        retention changed)."""
        return self._conversations.page_count()

    def sequence_hashes(self, request_id: str) -> SequenceHashes | None:
        """The request's tokens and block ids (read only), or None for a request not tracked."""
        state = self._requests.get(request_id)
        return None if state is None else state.sequence

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
        branch_hints: Sequence[int] = (),
    ) -> None:
        """Start tracking a request and hash its prompt's full blocks. `branch_hints`: prompt
        positions where later turns are likely to branch off (`branch_points.py`)."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already tracked")
        state = RequestState.for_prompt(
            request_id, prompt_token_ids, conversation_id, extra_key, self.config.block_size
        )
        if not all(0 < hint <= state.prompt_len for hint in branch_hints):
            raise ValueError(
                f"request {request_id!r}: branch_hints must lie in [1, {state.prompt_len}] "
                f"(the prompt), got {list(branch_hints)}"
            )
        state.branch_hints = tuple(int(hint) for hint in branch_hints)
        self._requests[request_id] = state

    def add_prefix_request(
        self,
        request_id: str,
        source_request_id: str,
        num_tokens: int,
        conversation_id: str | None = None,
    ) -> None:
        """`add_request(request_id, the first num_tokens tokens of source_request_id's,
        conversation_id, its extra key)` without hashing them again (a hold of part of a
        tracked request's prompt)."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already tracked")
        sequence = self._state(source_request_id).sequence.prefix(num_tokens)
        self._requests[request_id] = RequestState.for_sequence(
            request_id, sequence, conversation_id
        )

    def can_admit(self, request_id: str, num_new_tokens: int) -> bool:
        """True if `admit(request_id, num_new_tokens)` would succeed now."""
        if self._state(request_id).admitted:
            return False
        return self._fits(self._state(request_id), self.match(request_id), num_new_tokens)

    def admissible_tokens(self, request_id: str, max_new_tokens: int) -> int | None:
        """The new tokens after the reusable prefix (at most `max_new_tokens`) that `admit`
        would take now, or None when they do not fit; one match, where `match` and then
        `can_admit` would make two (a waiting request is asked every step)."""
        state = self._state(request_id)
        if state.admitted:
            return None
        match = self.match(request_id)
        count = min(state.prompt_len - match.num_reusable_tokens, max_new_tokens)
        return count if self._fits(state, match, count) else None

    def admit(self, request_id: str, num_new_tokens: int) -> Allocation:
        """Take the matched prefix and pages for the first `num_new_tokens` tokens after it.

        Raises MatchShrankError (nothing taken) when a disk block of the match turned out
        unreadable and the rest no longer fits: the caller may try again later."""
        self._check_tokens(num_new_tokens)
        if not self.can_admit(request_id, num_new_tokens):
            raise ValueError(f"request {request_id!r} cannot be admitted for {num_new_tokens}")
        state = self._state(request_id)
        match = self._admit_match(state, lambda current: self._fits(state, current, num_new_tokens))
        whole_prefix_tokens = match.num_whole_prefix_blocks * self.config.block_size
        plan_commits(state, self.life_cycles, self.config, whole_prefix_tokens)
        allocation = self.allocate(request_id, num_new_tokens)
        if self._changes is not None:
            self._changes.replaced(state)
        return allocation

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
        self._admit_match(state, partial(self._computed_fits, state))
        plan_commits(state, self.life_cycles, self.config)
        new_pages = take_computed(state, self.pools, self.life_cycles, self.config)
        self.tiers.flush()
        if self._changes is not None:
            self._changes.replaced(state)
        return self._allocation(state, new_pages)

    def can_allocate(self, request_id: str, num_new_tokens: int) -> bool:
        """True if `allocate(request_id, num_new_tokens)` would succeed now."""
        state = self._state(request_id)
        if not state.admitted:
            return False
        required = self._required_pools()
        return tables_fit(state, num_new_tokens, self.life_cycles, self.config, required)

    def allocate(self, request_id: str, num_new_tokens: int) -> Allocation:
        """Pages for tokens [computed, computed + new); optional life cycles are best-effort."""
        self._check_tokens(num_new_tokens)
        if not self.can_allocate(request_id, num_new_tokens):
            raise ValueError(f"request {request_id!r} cannot allocate {num_new_tokens} tokens")
        state = self._state(request_id)
        lengths = self._lengths(state)
        new_pages = take_next(state, self.pools, num_new_tokens, self.life_cycles, self.config)
        self.tiers.flush()
        self._grown(state, lengths)
        return self._allocation(state, new_pages)

    def can_allocate_all(self, request_ids: Sequence[str], num_new_tokens: int) -> bool:
        """True if `allocate_all(request_ids, num_new_tokens)` would succeed now: every request
        is admitted and the required pools hold all of their new pages together."""
        return self._all_fit([self._state(r) for r in request_ids], num_new_tokens)

    def allocate_all(self, request_ids: Sequence[str], num_new_tokens: int) -> int:
        """`allocate(r, num_new_tokens)` for each request in order, in one call (a decode step
        of the whole batch); all or nothing. Returns the pages taken."""
        taken = self.try_allocate_all(request_ids, num_new_tokens)
        if taken is None:
            raise ValueError(f"{len(request_ids)} requests cannot allocate {num_new_tokens} each")
        return taken

    def try_allocate_all(self, request_ids: Sequence[str], num_new_tokens: int) -> int | None:
        """`allocate_all` where `can_allocate_all` holds (one pass where the two calls make
        two); None, and nothing taken, where it does not."""
        self._check_tokens(num_new_tokens)
        block_size, growing = self.config.block_size, []
        for request_id in request_ids:
            state = self._state(request_id)
            if not state.admitted:
                return None
            # Most decode tokens land in a page the request holds: only the others take pages.
            num_blocks = blocks_for(state.num_computed_tokens + num_new_tokens, block_size)
            for table in state.page_tables.values():
                if len(table) < num_blocks:
                    growing.append(state)
                    break
        if not self._all_fit(growing, num_new_tokens):
            return None
        taken = 0
        for state in growing:
            lengths = self._lengths(state)
            new_pages = take_next(state, self.pools, num_new_tokens, self.life_cycles, self.config)
            self._grown(state, lengths)
            for pages in new_pages.values():
                taken += len(pages)
        self.tiers.flush()
        return taken

    def _all_fit(self, states: Sequence[RequestState], num_new_tokens: int) -> bool:
        if not all(state.admitted for state in states):
            return False
        demand = pages_demanded(states, num_new_tokens, self.life_cycles, self.config, self.pools)
        return all(demand[name] <= pool.num_available() for name, pool in self._required_pools())

    def append_tokens(self, request_id: str, token_ids: Sequence[int] | np.ndarray) -> None:
        """Extend the request's sequence with generated tokens, so their blocks can commit."""
        self._state(request_id).sequence.extend(token_ids)

    def append_tokens_all(
        self, request_ids: Sequence[str], token_ids: Sequence[int] | np.ndarray
    ) -> None:
        """`append_tokens(r, [t])` for each request and its one token, in order, in one call
        (a decode step's sampled tokens); all or nothing: an unknown request or a token id out
        of range raises before anything is appended."""
        if len(request_ids) != len(token_ids):
            raise ValueError(f"{len(request_ids)} requests but {len(token_ids)} tokens")
        sequences = [self._state(request_id).sequence for request_id in request_ids]
        SequenceHashes.extend_each(sequences, pack_tokens(token_ids))

    def commit(self, request_id: str, num_computed_tokens: int) -> None:
        """Record computed tokens: commit full blocks per policy, release slid-out pages."""
        state = self._state(request_id)
        state.check_commit(num_computed_tokens, self.config.block_size)
        self._commit(state, num_computed_tokens)

    def commit_all(self, request_ids: Sequence[str], num_computed_tokens: Sequence[int]) -> None:
        """`commit(r, n)` for each request and its count, in order, in one call (a decode
        step's); all or nothing: every count is checked before anything commits, and a request
        named twice raises."""
        if len(request_ids) != len(num_computed_tokens):
            raise ValueError(f"{len(request_ids)} requests but {len(num_computed_tokens)} counts")
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("commit_all names a request more than once")
        states = [self._state(request_id) for request_id in request_ids]
        block_size = self.config.block_size
        for state, count in zip(states, num_computed_tokens, strict=True):
            state.check_commit(count, block_size)
        # A decode token that completes no block commits nothing and, where no window slides,
        # releases nothing: only its count changes (what `_commit` would leave).
        reusable = [name for name, lc in self.life_cycles.items() if lc.reusable]
        only_count = not self._sliding and not self.tiers.keeps_contents
        for state, count in zip(states, num_computed_tokens, strict=True):
            if only_count:
                num_hashed = min(count, state.sequence.num_tokens) // block_size
                next_commit = state.next_commit
                for name in reusable:
                    if next_commit[name] < num_hashed:
                        break  # a block to commit
                else:
                    state.num_computed_tokens = count
                    continue
            self._commit(state, count)

    def _commit(self, state: RequestState, num_computed_tokens: int) -> None:
        state.num_computed_tokens = num_computed_tokens
        num_hashed = min(num_computed_tokens, state.sequence.num_tokens) // self.config.block_size
        every_block = self.config.reuse_policy.commits_every_block
        commit_computed(state, self.pools, self.life_cycles, num_hashed, every_block)
        self._remember_contents(state, num_hashed)
        self._release_slid_out(state)

    def finish_context(self, request_id: str) -> tuple[DropPlan, ...]:
        """At the prompt end: retain this turn's endpoints, drop turns beyond the policy's count."""
        state = self._state(request_id)
        state.check_context_end()
        state.context_done = True
        if self._changes is not None:
            for name, kept in state.keep.items():
                for index in kept:
                    if index < state.next_release[name]:
                        self._changes.touched(request_id, name, index, index + 1)
        release_kept(state, self.pools)
        self._release_slid_out(state)
        return self._conversations.retain(state)

    def finish_request(self, request_id: str) -> None:
        """Release every page the request holds (at its end or on cancel) and forget it."""
        state = self._state(request_id)
        release_tables(state, self.pools)
        self.tiers.forget(state.sequence.hashes[: state.contents_known])
        del self._requests[request_id]
        if self._changes is not None:
            self._changes.ended(request_id)

    def prefetch(self, waiting_request_ids: Sequence[str]) -> int:
        """Read the disk blocks of the first `disk_prefetch_num_reqs` waiting requests to host
        in the background (others in flight are cancelled); returns the reads queued.

        Finished reads land on host here, at `admit`, or at `land_prefetched`.
        """
        self.tiers.land_prefetched()
        if not self.tiers.has_disk:
            return 0  # nothing is on disk: no waiting request's match to walk
        keys: list[tuple[str, int]] = []
        contents: dict[int, bytes] = {}
        for request_id in waiting_request_ids[: self.tiers.disk_prefetch_num_reqs]:
            state = self._state(request_id)
            if state.admitted:
                continue
            sequence = state.sequence
            for name, block_hash, index in disk_blocks(self.match(request_id), sequence.hashes):
                keys.append((name, block_hash))
                if self.tiers.keeps_contents:
                    contents[block_hash] = sequence.contents(index)
        return self.tiers.prefetch(keys, contents)

    def land_prefetched(self) -> int:
        """Put finished background disk reads on the host tier; returns how many landed."""
        return self.tiers.land_prefetched()

    def drop_conversation(self, conversation_id: str) -> tuple[DropPlan, ...]:
        """Release every retained turn of a conversation that has ended."""
        return self._conversations.drop(conversation_id)

    def can_release_conversation(self, conversation_id: str) -> bool:
        """True if `release_conversation(conversation_id)` would succeed: it retains turns."""
        return bool(self._conversations.records(conversation_id))

    def release_conversation(
        self, conversation_id: str, keep_seconds: float = 0.0
    ) -> tuple[TurnRelease, ...]:
        """Hand a conversation's retained-turn refs to the LRU (memory pressure; it goes on).

        Unlike `drop_conversation` nothing is freed: pages nobody else holds become evictable,
        stay matchable until evicted, and are offloaded by the tiers when they are. With
        `keep_seconds` (what is left of its client's cache TTL) the host and disk tiers evict
        its blocks after all others for that long.
        """
        if not self.can_release_conversation(conversation_id):
            raise ValueError(f"conversation {conversation_id!r} retains no turns to release")
        if keep_seconds > 0:
            blocks = self._conversations.retained_blocks(conversation_id).values()
            self.tiers.keep_for([h for pairs in blocks for _, h in pairs], keep_seconds)
        return self._conversations.release(conversation_id)

    def release_branch_records(self, conversation_id: str) -> tuple[TurnRelease, ...]:
        """Hand only a conversation's branch records to the LRU (the first thing memory pressure
        takes: they serve resets, its turns serve every next turn); none if it holds none."""
        return self._conversations.release_branches(conversation_id)

    # -- drain (scale-in) ------------------------------------------------------------------------

    def num_retained_off_disk(self, conversation_id: str | None = None) -> int:
        """Blocks `flush_retained_to_disk(conversation_id)` would write now (no mutation)."""
        blocks = self._conversations.retained_blocks(conversation_id)
        return sum(
            self.tiers.num_off_disk(name, [block_hash for _, block_hash in pairs])
            for name, pairs in blocks.items()
        )

    def flush_retained_to_disk(self, conversation_id: str | None = None) -> int:
        """Write the committed blocks that retained turns hold (of every conversation, or of
        one) to the shared disk tier, skipping those it has; returns blocks written (0 without
        a disk tier).

        A draining rank calls it so that a rank sharing the disk resumes its conversations.
        Nothing else changes: the pages stay on the device and retained, and no KV event is
        sent (the shared disk is no rank's).
        """
        blocks = self._conversations.retained_blocks(conversation_id)
        return sum(self.tiers.write_device_blocks(name, pairs) for name, pairs in blocks.items())

    def computed_block_ids(self, request_id: str) -> tuple[int, ...]:
        """Ids of the request's full blocks whose KV is computed: a next turn that extends
        the request (prompt and output) resumes at their end."""
        state = self._state(request_id)
        return tuple(state.sequence.hashes[: state.num_computed_tokens // self.config.block_size])

    def flush_resume_point_to_disk(self, block_ids: Sequence[int]) -> int:
        """Write the blocks that resuming after `block_ids` (a prefix's full blocks, from
        `computed_block_ids`) needs and that are still on the device to the shared disk tier,
        skipping those it has; returns blocks written (0 without a disk tier). Changes nothing
        else, as `flush_retained_to_disk`."""
        size = self.config.block_size
        blocks = cached_resume_blocks(self.pools, self.life_cycles, size, block_ids)
        return sum(self.tiers.write_device_blocks(name, pairs) for name, pairs in blocks.items())

    # -- invariants ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every pool's counts and ref counts match its holders."""
        check_pools(self.pools, self._requests.values(), self._conversations.all_turns())
        self.tiers.check_integrity()

    # -- internals -------------------------------------------------------------------------------

    def _state(self, request_id: str) -> RequestState:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

    def _remember_contents(self, state: RequestState, num_blocks: int) -> None:
        """Give the tiers the contents of the request's blocks up to `num_blocks` (committed or
        reused: any of them may be written to the shared disk later)."""
        if not self.tiers.keeps_contents:
            return
        sequence = state.sequence
        for index in range(state.contents_known, num_blocks):
            self.tiers.remember(sequence.hashes[index], partial(sequence.contents, index))
        state.contents_known = max(state.contents_known, num_blocks)

    def _on_device(self, life_cycle: str, block_hash: int) -> bool:
        return self.pools[life_cycle].lookup(block_hash) is not None

    def _fits(self, state: RequestState, match: PrefixMatch, num_new_tokens: int) -> bool:
        required = self._required_pools()
        return match_fits(state, match, num_new_tokens, self.life_cycles, self.config, required)

    def _computed_fits(self, state: RequestState, match: PrefixMatch) -> bool:
        required = self._required_pools()
        return computed_fits(state, match, self.life_cycles, self.config, required)

    def _admit_match(self, state: RequestState, fits: Callable[[PrefixMatch], bool]) -> PrefixMatch:
        match = partial(self.match, state.request_id)
        return admit_match(state, match, fits, self.pools, self.life_cycles, self.tiers)

    def _allocation(self, state: RequestState, new_pages: dict[str, tuple[int, ...]]) -> Allocation:
        """The request's allocation now: its page tables' extent and the pages just taken."""
        num_tokens = len(next(iter(state.page_tables.values()))) * self.config.block_size
        return Allocation(state.request_id, state.num_reused_tokens, num_tokens, new_pages)

    @staticmethod
    def _check_tokens(num_new_tokens: int) -> None:
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")

    def _required_pools(self) -> list[tuple[str, BlockPool]]:
        return [(n, p) for n, p in self.pools.items() if self.life_cycles[n].required]

    def _release_slid_out(self, state: RequestState) -> None:
        """Release the pages that slid out of the request's windows since the last commit."""
        if not self._sliding:
            return
        if self._changes is None:
            release_slid_out(state, self.pools, self._sliding, self.config.block_size)
            return
        before = {name: state.next_release[name] for name in self._sliding}
        release_slid_out(state, self.pools, self._sliding, self.config.block_size)
        for name, first in before.items():
            end = min(state.next_release[name], len(state.page_tables[name]))
            self._changes.touched(state.request_id, name, first, end)

    def _lengths(self, state: RequestState) -> dict[str, int] | None:
        """The request's table lengths before an allocation (None: nobody watches)."""
        if self._changes is None:
            return None
        return {name: len(table) for name, table in state.page_tables.items()}

    def _grown(self, state: RequestState, lengths: dict[str, int] | None) -> None:
        """Note the entries an allocation appended (`take_next` writes only past the end)."""
        changes = self._changes
        if lengths is not None and changes is not None:
            for name, table in state.page_tables.items():
                changes.touched(state.request_id, name, lengths[name], len(table))
