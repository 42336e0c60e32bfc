"""Admission's tier step: give staged host/disk blocks device pages and copy them up.

Called by the manager (the only writer of its pools and page tables) from `admit`, after the
matched device pages are referenced, so taking pages here can never evict the match itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..block_pool import BlockPool
from ..life_cycles import LifeCycle
from .stack import KVTiers, StagedBlock


def onboard_staged(
    tiers: KVTiers,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    page_tables: Mapping[str, list[int]],
    staged: Mapping[str, list[StagedBlock]],
) -> None:
    """Take pages for staged blocks, offload what that evicts, copy up, commit, fill tables.

    Required life cycles get a page for every staged block (admission checked the room);
    optional ones as many as are available (the rest stay NULL_PAGE, as at allocation).
    """
    taken: dict[str, list[int]] = {}
    for name, blocks in staged.items():
        pool = pools[name]
        wanted = len(blocks)
        if not life_cycles[name].required:
            wanted = min(wanted, pool.num_available())
        taken[name] = pool.take(wanted)
    # NOTE: evicted pages reach host before the copies below overwrite them (same stream).
    tiers.flush()
    for name, pages in taken.items():
        blocks = staged[name][: len(pages)]
        tiers.onboard(name, pages, blocks)
        table = page_tables[name]
        for page, block in zip(pages, blocks, strict=True):
            pools[name].commit(page, block.block_hash)
            table[block.position] = page
