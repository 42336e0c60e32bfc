"""Longest-prefix match that honours every life cycle (reads pools, writes nothing).

The reusable length is the largest block-aligned position at which every required reusable life
cycle can resume: full life cycles bound it by their run of cached blocks from the start, the
others are checked at each candidate position from the top down (failing fast on the last block).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvfleet.kvstore.block_pool import NULL_PAGE, BlockPool
from kvfleet.kvstore.life_cycles import LifeCycle
from kvfleet.kvstore.results import PrefixMatch


def cached_run(pool: BlockPool, hashes: Sequence[int], limit: int) -> int:
    """How many of the first `limit` blocks are cached in `pool`, counted from the start."""
    for index in range(limit):
        if pool.lookup(hashes[index]) is None:
            return index
    return limit


def can_resume(
    pool: BlockPool, life_cycle: LifeCycle, hashes: Sequence[int], k: int, block_size: int
) -> bool:
    """True if every block `life_cycle` needs to resume at block `k` is cached."""
    needed = reversed(life_cycle.resume_blocks(k, block_size))
    return all(pool.lookup(hashes[index]) is not None for index in needed)


def find_prefix(
    hashes: Sequence[int],
    max_blocks: int,
    life_cycles: Sequence[LifeCycle],
    pools: Mapping[str, BlockPool],
    block_size: int,
) -> PrefixMatch:
    """The longest prefix (<= `max_blocks` blocks) every required life cycle can resume."""
    limit = min(max_blocks, len(hashes))
    required = [lc for lc in life_cycles if lc.reusable and lc.required]
    for life_cycle in required:
        if life_cycle.needs_whole_prefix:
            limit = cached_run(pools[life_cycle.name], hashes, limit)
    others = [lc for lc in required if not lc.needs_whole_prefix]
    k = limit
    while k > 0 and not all(can_resume(pools[lc.name], lc, hashes, k, block_size) for lc in others):
        k -= 1
    pages = {lc.name: _pages_at(pools[lc.name], lc, hashes, k, block_size) for lc in life_cycles}
    return PrefixMatch(k * block_size, k, pages)


def _pages_at(
    pool: BlockPool, life_cycle: LifeCycle, hashes: Sequence[int], k: int, block_size: int
) -> tuple[int, ...]:
    """Position-aligned pages of `life_cycle` for a resume at block k (NULL where not needed)."""
    if life_cycle.needs_whole_prefix and life_cycle.required:
        lookup = pool.lookup
        return tuple([lookup(h) for h in hashes[:k]])
    table = [NULL_PAGE] * k
    for index in life_cycle.resume_blocks(k, block_size):
        page = pool.lookup(hashes[index])
        table[index] = NULL_PAGE if page is None else page
    return tuple(table)
