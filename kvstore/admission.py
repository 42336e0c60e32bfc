"""Tier-aware admission: whether a match plus new blocks fits, and taking the match's pages.

Helpers of `KVCacheManager.admit`, `admit_computed` and `allocate`: they read or change only the
pools, tiers and request state the manager hands them (the manager stays the single writer of
each).

A prompt computed elsewhere (a hand-off: its bytes arrive, nothing is prefilled here) gets pages
only for the blocks after its reused prefix (k blocks, of n) that decoding reads or the reuse
policy commits (`computed_blocks`), with B the block size, P the prompt length, C the planned
checkpoint:

| life cycle                          | blocks with pages (then only those >= k)           |
|-------------------------------------|----------------------------------------------------|
| whole prefix (full), private        | 0 .. n-1                                           |
| any reusable one, `all_reusable`    | 0 .. n-1                                           |
| window, state                       | live at P (`first_live_block(P)` .. n-1), endpoint |
|                                     | window `resume_blocks(P // B)`, checkpoint window  |
|                                     | `resume_blocks(C // B)`, snapshot blocks           |

A prefilled chunk (`take_next`) gets a page at each new block, except on a state life cycle
(`pages_only_where_stored`): only at its commit blocks and the chunk's last block (the running
state), holes elsewhere (`paged_blocks`); the room checks count those same pages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .block_pool import NULL_PAGE, BlockPool
from .config import KVStoreConfig
from .hashing import SequenceHashes
from .life_cycles import LifeCycle
from .request_state import RequestState
from .results import PrefixMatch
from .slide_out import commit_plan, planned_checkpoint
from .tiers.metrics import DISK
from .tiers.onboarding import onboard_staged
from .tiers.stack import KVTiers, StagedBlock, StaleMatchError


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one may be partial)."""
    return -(-num_tokens // block_size)


def paged_blocks(
    life_cycle: LifeCycle,
    commit_blocks: frozenset[int],
    every_block: bool,
    first: int,
    num_blocks: int,
) -> list[int]:
    """The blocks of `first .. num_blocks-1` (a chunk's new blocks) that get a page.

    All of them, except on a life cycle with `pages_only_where_stored` (state): only the blocks
    its request commits (snapshots, and every block under a policy that commits every block)
    and the last one (the running state); the others stay holes.
    """
    if not life_cycle.pages_only_where_stored or every_block:
        return list(range(first, num_blocks))
    last = num_blocks - 1
    return [index for index in range(first, num_blocks) if index in commit_blocks or index == last]


def new_page_counts(
    life_cycles: Mapping[str, LifeCycle],
    commit_blocks: Mapping[str, frozenset[int]],
    every_block: bool,
    first: Mapping[str, int],
    num_blocks: int,
) -> dict[str, int]:
    """Per life cycle, the pages a chunk takes to extend its page table from `first[name]`
    blocks to `num_blocks` (`paged_blocks`)."""
    return {
        name: len(paged_blocks(lc, commit_blocks[name], every_block, first[name], num_blocks))
        for name, lc in life_cycles.items()
    }


def match_fits(
    state: RequestState,
    match: PrefixMatch,
    num_new_tokens: int,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    required_pools: Sequence[tuple[str, BlockPool]],
) -> bool:
    """True if every required pool has room for the match's onboarded blocks and the pages its
    first `num_new_tokens` tokens take (`paged_blocks`, under the commit plan that admitting
    at this match sets)."""
    bs, reused = config.block_size, match.num_reusable_tokens
    whole_prefix_tokens = match.num_whole_prefix_blocks * bs
    plan = commit_plan(
        life_cycles, config, state.prompt_len, reused, whole_prefix_tokens, state.branch_hints
    )
    every_block = config.reuse_policy.commits_every_block
    first = dict.fromkeys(life_cycles, match.num_reusable_blocks)
    num_blocks = blocks_for(reused + num_new_tokens, bs)
    counts = new_page_counts(life_cycles, plan.commit_blocks, every_block, first, num_blocks)
    return pages_fit(match, counts, required_pools)


def pages_fit(
    match: PrefixMatch,
    new_pages: Mapping[str, int],
    required_pools: Sequence[tuple[str, BlockPool]],
) -> bool:
    """True if every required pool has room for its `new_pages` and the match's onboarded
    blocks (matched pages evictable now count against the room: a ref takes them)."""
    for name, pool in required_pools:
        revived = sum(map(pool.evictable_now, match.pages[name]))
        needed = new_pages[name] + match.num_lower(name)
        if needed > pool.num_available() - revived:
            return False
    return True


def computed_fits(
    state: RequestState,
    match: PrefixMatch,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    required_pools: Sequence[tuple[str, BlockPool]],
) -> bool:
    """True if every required pool has room for the match and the pages a prompt computed
    elsewhere gets after it (`computed_blocks`)."""
    blocks = computed_blocks(life_cycles, config, state.prompt_len, match.num_reusable_tokens)
    counts = {name: len(indices) for name, indices in blocks.items()}
    return pages_fit(match, counts, required_pools)


def tables_fit(
    state: RequestState,
    num_new_tokens: int,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    required_pools: Sequence[tuple[str, BlockPool]],
) -> bool:
    """True if every required pool has room to extend the request's page table over
    `num_new_tokens` tokens after its computed ones (`take_next`'s pages)."""
    counts = _next_counts(state, num_new_tokens, life_cycles, config)
    return all(counts[name] <= pool.num_available() for name, pool in required_pools)


def _next_counts(
    state: RequestState,
    num_new_tokens: int,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
) -> dict[str, int]:
    num_blocks = blocks_for(state.num_computed_tokens + num_new_tokens, config.block_size)
    first = {name: min(len(table), num_blocks) for name, table in state.page_tables.items()}
    every_block = config.reuse_policy.commits_every_block
    return new_page_counts(life_cycles, state.commit_blocks, every_block, first, num_blocks)


def pages_demanded(
    states: Sequence[RequestState],
    num_new_tokens: int,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    pools: Mapping[str, BlockPool],
) -> dict[str, int]:
    """Per pool, the new pages extending every request's table over `num_new_tokens` more
    tokens after its computed ones takes (`tables_fit`'s count, summed)."""
    demand = dict.fromkeys(pools, 0)
    block_size = config.block_size
    for state in states:
        # Most decode tokens land in a page the request holds: nothing to count.
        num_blocks = blocks_for(state.num_computed_tokens + num_new_tokens, block_size)
        if all(len(table) >= num_blocks for table in state.page_tables.values()):
            continue
        for name, count in _next_counts(state, num_new_tokens, life_cycles, config).items():
            demand[name] += count
    return demand


def computed_blocks(
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    prompt_len: int,
    num_reused_tokens: int,
) -> dict[str, tuple[int, ...]]:
    """Per life cycle, the ascending blocks after the reused prefix that a prompt computed
    elsewhere gets pages for (the table above)."""
    bs = config.block_size
    num_blocks, end_blocks = blocks_for(prompt_len, bs), prompt_len // bs
    checkpoint = planned_checkpoint(config, prompt_len, num_reused_tokens)
    every_block = config.reuse_policy.commits_every_block
    first = num_reused_tokens // bs
    picked = {}
    for name, life_cycle in life_cycles.items():
        needed = set(range(life_cycle.first_live_block(prompt_len, bs), num_blocks))
        if life_cycle.needs_whole_prefix or (every_block and life_cycle.reusable):
            needed.update(range(end_blocks))
        elif life_cycle.reusable:
            needed.update(life_cycle.resume_blocks(end_blocks, bs))
            if checkpoint is not None:
                needed.update(life_cycle.resume_blocks(checkpoint // bs, bs))
            needed.update(life_cycle.snapshot_blocks(prompt_len, bs))
        picked[name] = tuple(sorted(index for index in needed if index >= first))
    return picked


def disk_blocks(match: PrefixMatch, hashes: Sequence[int]) -> list[tuple[str, int, int]]:
    """The (life cycle, block id, index) of every matched block that only the disk tier holds."""
    return [
        (name, hashes[index], index)
        for name, where in match.locations.items()
        for index, tier in enumerate(where)
        if tier == DISK
    ]


def staged_match(
    match: Callable[[], PrefixMatch], tiers: KVTiers, sequence: SequenceHashes
) -> tuple[PrefixMatch, dict[str, list[StagedBlock]]]:
    """Match and stage its host/disk blocks; a bad disk file (or another block's under a
    colliding id) drops out and we match again."""
    while True:  # each retry has forgotten at least one disk block, so this ends
        current = match()
        try:
            return current, tiers.stage(current, sequence.hashes, sequence.contents)
        except StaleMatchError:
            continue


class MatchShrankError(ValueError):
    """The match shrank while it was staged (a disk block turned out unreadable) and no longer
    fits: nothing was taken, and the request may try again with what is left."""


def admit_match(
    state: RequestState,
    match: Callable[[], PrefixMatch],
    fits: Callable[[PrefixMatch], bool],
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    tiers: KVTiers,
) -> PrefixMatch:
    """Land finished prefetches, match and stage, check the staged match still `fits`, then
    ref it and onboard its staged blocks: the request is admitted at the match's end.

    Raises MatchShrankError (nothing taken) when the match shrank and no longer fits.
    """
    tiers.land_prefetched()
    current, staged = staged_match(match, tiers, state.sequence)
    try:
        if not fits(current):
            raise MatchShrankError(
                f"request {state.request_id!r}: its match shrank and no longer fits"
            )
        take_match(state, current, staged, pools, life_cycles, tiers)
    finally:
        tiers.release_pins()
    state.admitted = True
    state.num_reused_tokens = state.num_computed_tokens = current.num_reusable_tokens
    return current


def take_match(
    state: RequestState,
    match: PrefixMatch,
    staged: dict[str, list[StagedBlock]],
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    tiers: KVTiers,
) -> None:
    """Ref the match's device pages into the request's page tables and onboard staged blocks."""
    for name, pages in match.pages.items():
        pools[name].ref_all(pages)
        tiers.count_device_hits(len(pages) - pages.count(NULL_PAGE))
        state.page_tables[name] = list(pages)
        state.next_commit[name] = match.num_reusable_blocks
        state.next_release[name] = 0
    onboard_staged(tiers, pools, life_cycles, state.page_tables, staged)


def take_computed(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
) -> dict[str, tuple[int, ...]]:
    """Extend the page tables over the whole prompt and give each block `computed_blocks` picks
    a new page, NULL_PAGE elsewhere; the pages taken per life cycle (an optional one short of
    pages gets its last blocks: decoding reads the end)."""
    blocks = computed_blocks(life_cycles, config, state.prompt_len, state.num_reused_tokens)
    num_blocks = blocks_for(state.prompt_len, config.block_size)
    taken = {}
    for name, pool in pools.items():
        wanted, table = blocks[name], state.page_tables[name]
        pages = pool.take(min(len(wanted), pool.num_available()))
        table.extend([NULL_PAGE] * (num_blocks - len(table)))
        for index, page in zip(wanted[len(wanted) - len(pages) :], pages, strict=True):
            table[index] = page
        taken[name] = tuple(pages)
    return taken


def take_next(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    num_new_tokens: int,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
) -> dict[str, tuple[int, ...]]:
    """Extend every page table over `num_new_tokens` tokens after the computed ones, with new
    pages at the blocks `paged_blocks` picks and NULL_PAGE at the others (and where an optional
    life cycle falls short of pages). The pages taken per life cycle."""
    num_blocks = blocks_for(state.num_computed_tokens + num_new_tokens, config.block_size)
    every_block = config.reuse_policy.commits_every_block
    taken = {}
    for name, pool in pools.items():
        table = state.page_tables[name]
        first = len(table)
        wanted = paged_blocks(
            life_cycles[name], state.commit_blocks[name], every_block, first, num_blocks
        )
        pages = pool.take(min(len(wanted), pool.num_available()))  # only optional ones fall short
        table.extend([NULL_PAGE] * max(0, num_blocks - first))
        for index, page in zip(wanted, pages, strict=False):
            table[index] = page
        taken[name] = tuple(pages)
    return taken
