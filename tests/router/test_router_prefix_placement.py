"""New conversations go where the KV events say their prefix is."""

from __future__ import annotations

from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo
from kvfleet.services.router.prefix_index import PrefixIndex, chain_keys
from kvfleet.services.router.store import LocalStore


def test_overlap_counts_leading_blocks_only():
    """A hole in the middle of a prefix would be counted as reusable."""
    index = PrefixIndex()
    index.stored("a", [11, 12], None, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    keys = chain_keys([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4)
    assert index.overlap("a", keys) == 2
    index.removed("a", [11])
    assert index.overlap("a", keys) == 0
    assert index.block_count("a") == 1


def test_block_with_unknown_parent_is_skipped():
    """Keying a block without its parent would claim a prefix the rank does not hold."""
    index = PrefixIndex()
    assert index.stored("a", [21], 99, [1, 2, 3, 4], 4) == 0
    assert index.block_count("a") == 0


def test_prefix_placement_prefers_rank_holding_the_prefix(clock):
    """Prefix placement would fall back to load order if overlap were ignored."""
    store, index = LocalStore(), PrefixIndex()
    for rank_id in ("a", "b"):
        store.register_rank(RankInfo(rank_id, rank_id, 4, block_size=4), clock())
    index.stored("b", [31, 32], None, [5, 6, 7, 8, 9, 10, 11, 12], 4)
    queue = AdmissionQueue(store, AdmissionConfig(placement="prefix"), clock, index)
    prompt = (5, 6, 7, 8, 9, 10, 11, 12, 13)
    queue.enqueue(PendingRequest("q1", "new-conv", clock(), prompt_tokens=prompt))
    queue.enqueue(PendingRequest("q2", "other", clock(), prompt_tokens=(1, 1, 1, 1)))
    result = queue.run_pass()
    assert [(a.request.request_id, a.rank.rank_id, a.placement) for a in result.admitted] == [
        ("q1", "b", Placement.NEW),
        ("q2", "a", Placement.NEW),
    ]
    store.check_integrity()
