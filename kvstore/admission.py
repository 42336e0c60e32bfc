"""Tier-aware admission: whether a match plus new blocks fits, and taking the match's pages.

Helpers of `KVCacheManager.admit`: they read or change only the pools, tiers and request state
the manager hands them (the manager stays the single writer of each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvfleet.kvstore.block_pool import NULL_PAGE, BlockPool
from kvfleet.kvstore.life_cycles import LifeCycle
from kvfleet.kvstore.request_state import RequestState
from kvfleet.kvstore.results import PrefixMatch
from kvfleet.kvstore.tiers.onboarding import onboard_staged
from kvfleet.kvstore.tiers.stack import KVTiers, StagedBlock, StaleMatchError


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one may be partial)."""
    return -(-num_tokens // block_size)


def match_fits(
    match: PrefixMatch,
    num_new_tokens: int,
    required_pools: Sequence[tuple[str, BlockPool]],
    block_size: int,
) -> bool:
    """True if every required pool has room for the new blocks and the onboarded ones.

    Matched pages that are evictable now stop being available once referenced, so they count
    against the room too.
    """
    blocks_after = blocks_for(match.num_reusable_tokens + num_new_tokens, block_size)
    for name, pool in required_pools:
        revived = sum(1 for page in match.pages[name] if pool.is_evictable(page))
        needed = blocks_after - match.num_reusable_blocks + match.num_lower(name)
        if needed > pool.num_available() - revived:
            return False
    return True


def staged_match(
    match: Callable[[], PrefixMatch], tiers: KVTiers, hashes: Sequence[int]
) -> tuple[PrefixMatch, dict[str, list[StagedBlock]]]:
    """Match and stage its host/disk blocks; a bad disk file drops out and we match again."""
    while True:  # each retry has forgotten at least one disk block, so this ends
        current = match()
        try:
            return current, tiers.stage(current, hashes)
        except StaleMatchError:
            continue


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
        for page in pages:
            if page != NULL_PAGE:
                pools[name].ref(page)
        tiers.count_device_hits(sum(page != NULL_PAGE for page in pages))
        state.page_tables[name] = list(pages)
        state.next_commit[name] = match.num_reusable_blocks
        state.next_release[name] = 0
    onboard_staged(tiers, pools, life_cycles, state.page_tables, staged)
