"""The block pool: ref counts, LRU eviction order, events, integrity."""

import pytest
from kvfleet.kvstore.block_pool import BlockPool, IntegrityError, PoolExhaustedError
from kvfleet.kvstore.events import KVEvent, KVEventKind


def make_pool(num_pages=5, events=None):
    return BlockPool("full", num_pages, events.append if events is not None else print)


def test_take_hands_out_free_pages_in_order_and_skips_null():
    """Page 0 is the null page; handing it out would corrupt position-aligned tables."""
    pool = make_pool()
    assert pool.take(4) == [1, 2, 3, 4]
    assert pool.num_available() == 0
    pool.check_integrity([1, 2, 3, 4])


def test_released_committed_pages_are_evicted_oldest_first():
    """LRU order: the page released first is reclaimed first, free pages before any cached."""
    events = []
    pool = make_pool(events=events)
    pages = pool.take(3)
    for page, block_hash in zip(pages, (10, 11, 12), strict=True):
        pool.commit(page, block_hash)
    pool.release(pages[1])
    pool.release(pages[0])
    pool.release(pages[2])
    assert pool.take(2) == [4, 2]
    assert pool.lookup(11) is None and pool.lookup(10) == 1
    assert events[-1] == KVEvent(KVEventKind.REMOVED, "full", 11)
    pool.check_integrity([4, 2])


def test_uncommitted_page_goes_back_to_free():
    """A page never committed holds nothing findable; caching it would leak capacity."""
    pool = make_pool()
    (page,) = pool.take(1)
    pool.release(page)
    assert (pool.num_free, pool.num_cached, pool.num_in_use) == (4, 0, 0)


def test_hit_on_cached_page_revives_it():
    """A ref on an evictable page must take it out of the LRU, or it could be evicted in use."""
    pool = make_pool(num_pages=3)
    (page,) = pool.take(1)
    pool.commit(page, 7)
    pool.release(page)
    pool.ref(page)
    assert pool.num_cached == 0
    assert pool.take(1) == [2]
    assert not pool.can_take(1)


def test_duplicate_commit_keeps_first_page():
    """Two requests computing the same block: the index keeps one page, the other stays private."""
    events = []
    pool = make_pool(events=events)
    first, second = pool.take(2)
    assert pool.commit(first, 9) is True
    assert pool.commit(second, 9) is False
    assert pool.lookup(9) == first
    assert events == [KVEvent(KVEventKind.STORED, "full", 9)]


def test_take_beyond_capacity_raises_with_counts():
    """Over-asking must fail before touching anything, with the numbers that explain it."""
    pool = make_pool()
    pool.take(3)
    with pytest.raises(PoolExhaustedError, match="asked 2 pages, 1 free"):
        pool.take(2)
    assert pool.num_free == 1


def test_integrity_detects_a_missing_holder():
    """A ref count no page table accounts for is a leak; the check must name it."""
    pool = make_pool()
    pool.take(2)
    with pytest.raises(IntegrityError, match="page 2 has ref 1 but 0 holders"):
        pool.check_integrity([1])


def test_drop_frees_a_cached_page_and_reports_removal():
    """A drop plan's page must leave the index at once and be reported to the router."""
    events = []
    pool = make_pool(events=events)
    (page,) = pool.take(1)
    pool.commit(page, 5)
    pool.release(page)
    pool.drop(page)
    assert pool.lookup(5) is None and pool.num_free == 4
    assert events[-1] == KVEvent(KVEventKind.REMOVED, "full", 5)
    pool.check_integrity()
