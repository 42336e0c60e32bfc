"""`allocate_all`, the decode step's one call for the whole batch, against `allocate` per request:
the same pages in the same page tables, the same pool state, all or nothing; `try_allocate_all`
the same where it fits, nothing (None) where it does not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_factories import make_manager, tokens
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle

HYBRID = (FullLifeCycle("full"), WindowLifeCycle("win", 8))


def decoding_managers(lengths: list[int], pages: int):
    """Two identical managers with one admitted, computed request per length."""
    managers = [make_manager(HYBRID, pages=pages, block_size=4) for _ in range(2)]
    for manager in managers:
        for i, length in enumerate(lengths):
            manager.add_request(f"r{i}", tokens(i, length))
            manager.admit(f"r{i}", length)
            manager.commit(f"r{i}", length)
            manager.append_tokens(f"r{i}", [7])
    return managers


def state_of(manager, ids):
    tables = {r: {lc: manager.page_table(r, lc) for lc in manager.life_cycles} for r in ids}
    free = {name: pool.num_available() for name, pool in manager.pools.items()}
    return tables, free


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 14), min_size=1, max_size=6),
    steps=st.integers(1, 9),
)
def test_allocate_all_equals_allocate_per_request(lengths, steps):
    batched, single = decoding_managers(lengths, pages=64)
    ids = [f"r{i}" for i in range(len(lengths))]
    for _ in range(steps):
        fits = batched.can_allocate_all(ids, 1)
        if not fits:
            break
        assert all(single.can_allocate(r, 1) for r in ids)
        taken = batched.try_allocate_all(ids, 1)
        before = {name: pool.num_available() for name, pool in single.pools.items()}
        for r in ids:
            single.allocate(r, 1)
        assert state_of(batched, ids) == state_of(single, ids)
        assert taken == sum(n - single.pools[name].num_available() for name, n in before.items())
        for manager in (batched, single):
            for r, start in zip(ids, manager.computed_tokens(ids), strict=True):
                manager.commit(r, start + 1)
                manager.append_tokens(r, [7])
            manager.check_integrity()
        assert state_of(batched, ids) == state_of(single, ids)


def test_allocate_all_is_all_or_nothing():
    # Four requests each at a block's end need a new page per pool; the pools hold fewer.
    lengths = [4, 8, 4, 8]
    manager = decoding_managers(lengths, pages=10)[0]
    ids = [f"r{i}" for i in range(len(lengths))]
    before = state_of(manager, ids)
    demand = len(ids)
    assert manager.pools["full"].num_available() < demand
    assert not manager.can_allocate_all(ids, 1)
    with pytest.raises(ValueError, match="cannot allocate"):
        manager.allocate_all(ids, 1)
    assert manager.try_allocate_all(ids, 1) is None
    assert state_of(manager, ids) == before
    manager.check_integrity()


def test_computed_tokens_reads_progress():
    manager = decoding_managers([5, 9], pages=32)[0]
    ids = ["r0", "r1"]
    assert (
        manager.computed_tokens(ids)
        == [manager.progress(r).num_computed_tokens for r in ids]
        == [5, 9]
    )
