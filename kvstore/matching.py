"""Longest-prefix match that honours every life cycle (reads pools and tiers, writes nothing).

The reusable length is the largest block-aligned position at which every required reusable life
cycle can resume: full life cycles bound it by their run of cached blocks from the start, the
others are checked at each candidate position from the top down (failing fast on the last block).
With tiers, a block counts as cached if the device pool or a lower tier (`locate`) has it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import islice, repeat, takewhile

from .block_pool import NULL_PAGE, BlockPool
from .config import KVStoreConfig
from .life_cycles import LifeCycle
from .results import PrefixMatch

# locate(life_cycle, block_hash) -> "host" / "disk" for a block off the device, else None.
Locate = Callable[[str, int], str | None]
Found = Callable[[int], bool]


def match_prompt(
    hashes: Sequence[int],
    prompt_len: int,
    config: KVStoreConfig,
    pools: Mapping[str, BlockPool],
    locate: Locate | None = None,
) -> PrefixMatch:
    """The longest reusable prefix of a prompt: `find_prefix` capped `max(1, R)` tokens before
    the prompt's end (R: the config's largest replay), block-aligned."""
    cap_tokens = prompt_len - max(1, config.max_replay_tokens)
    max_blocks = max(0, cap_tokens) // config.block_size
    return find_prefix(hashes, max_blocks, config.life_cycles, pools, config.block_size, locate)


def find_prefix(
    hashes: Sequence[int],
    max_blocks: int,
    life_cycles: Sequence[LifeCycle],
    pools: Mapping[str, BlockPool],
    block_size: int,
    locate: Locate | None = None,
) -> PrefixMatch:
    """The longest prefix (<= `max_blocks` blocks) every required life cycle can resume."""
    limit = min(max_blocks, len(hashes))
    required = [lc for lc in life_cycles if lc.reusable and lc.required]
    found = {lc.name: _finder(pools[lc.name], locate and _bind(locate, lc.name)) for lc in required}
    for life_cycle in required:
        if life_cycle.needs_whole_prefix:
            limit = _run(found[life_cycle.name], hashes, limit, pools[life_cycle.name].holds)
    whole = limit if any(lc.needs_whole_prefix for lc in required) else 0
    others = [lc for lc in required if not lc.needs_whole_prefix]
    k = limit
    while k > 0 and not all(_resumable(found[lc.name], lc, hashes, k, block_size) for lc in others):
        k -= 1
    pages = {lc.name: _pages_at(pools[lc.name], lc, hashes, k, block_size) for lc in life_cycles}
    if locate is None:
        return PrefixMatch(k * block_size, k, pages, {}, whole)
    locations = {
        lc.name: _locations(pages[lc.name], lc, hashes, k, block_size, _bind(locate, lc.name))
        for lc in life_cycles
    }
    return PrefixMatch(k * block_size, k, pages, locations, whole)


def _bind(locate: Locate, name: str) -> Callable[[int], str | None]:
    return lambda block_hash: locate(name, block_hash)


def _finder(pool: BlockPool, lower: Callable[[int], str | None] | None) -> Found:
    lookup = pool.lookup
    if lower is None:
        return lambda block_hash: lookup(block_hash) is not None
    return lambda block_hash: lookup(block_hash) is not None or lower(block_hash) is not None


def _run(found: Found, hashes: Sequence[int], limit: int, on_device: Found) -> int:
    """Blocks from the start, at most `limit`, that `found` finds: the run on the device in one
    C-level walk, then block by block (the host and disk tiers)."""
    start = len(list(takewhile(on_device, islice(hashes, limit))))
    for index in range(start, limit):
        if not found(hashes[index]):
            return index
    return limit


def _resumable(
    found: Found, life_cycle: LifeCycle, hashes: Sequence[int], k: int, block_size: int
) -> bool:
    needed = reversed(life_cycle.resume_blocks(k, block_size))
    return all(found(hashes[index]) for index in needed)


def _pages_at(
    pool: BlockPool, life_cycle: LifeCycle, hashes: Sequence[int], k: int, block_size: int
) -> tuple[int, ...]:
    """Position-aligned pages of `life_cycle` for a resume at block k (NULL where not needed)."""
    lookup = pool.lookup
    if life_cycle.needs_whole_prefix and life_cycle.required:
        return tuple(map(pool.page_or, hashes[:k], repeat(NULL_PAGE, k)))
    table = [NULL_PAGE] * k
    for index in life_cycle.resume_blocks(k, block_size):
        page = lookup(hashes[index])
        table[index] = NULL_PAGE if page is None else page
    return tuple(table)


def _locations(
    pages: tuple[int, ...],
    life_cycle: LifeCycle,
    hashes: Sequence[int],
    k: int,
    block_size: int,
    lower: Callable[[int], str | None],
) -> tuple[str, ...]:
    """Per block of the match: "device", "host", "disk", or "" where it is not needed/found."""
    where = [""] * k
    for index in life_cycle.resume_blocks(k, block_size):
        where[index] = "device" if pages[index] != NULL_PAGE else (lower(hashes[index]) or "")
    return tuple(where)
