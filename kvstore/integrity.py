"""The manager's integrity check: every pool's ref counts against the holders it can see.

A device page is held once per request page-table slot naming it and once per retained record
(turn, root or branch) naming it; `BlockPool.check_integrity` compares those counts with its refs
and its free/cached/in-use sets. Pure read: it changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from .block_pool import NULL_PAGE, BlockPool
from .request_state import RequestState
from .retention import RetainedTurns


def page_holders(
    pool_names: Iterable[str],
    requests: Iterable[RequestState],
    conversations: Iterable[RetainedTurns],
) -> dict[str, Counter[int]]:
    """Per pool, how many request page-table slots and retained records hold each page."""
    holders: dict[str, Counter[int]] = {name: Counter() for name in pool_names}
    for state in requests:
        for name, table in state.page_tables.items():
            holders[name].update(page for page in table if page != NULL_PAGE)
    for turns in conversations:
        for turn in turns.in_order():
            for name, pages in turn.pages.items():
                holders[name].update(page for page in pages if page is not None)
    return holders


def check_pools(
    pools: Mapping[str, BlockPool],
    requests: Iterable[RequestState],
    conversations: Iterable[RetainedTurns],
) -> None:
    """Raise IntegrityError unless every pool's counts and ref counts match its holders."""
    holders = page_holders(pools, requests, conversations)
    for name, pool in pools.items():
        pool.check_integrity(holders[name])
