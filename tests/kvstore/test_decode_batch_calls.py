"""`commit_all` and `append_tokens_all`, a decode step's commits and sampled tokens in one call
each, against `commit` and `append_tokens` per request: the same block hashes, pages, events and
table changes after any decode steps, context ends included; all or nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_factories import make_manager, tokens
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import AllReusable, PerRequest

HYBRID = (FullLifeCycle("full"), WindowLifeCycle("win", 8))
FULL = (FullLifeCycle("full"),)  # nothing slides: decode commits take the count-only path


def decoding_managers(lengths: list[int], policy, life_cycles=HYBRID) -> tuple[list, list[list]]:
    """Two identical watched managers, one admitted request per length with its prompt
    computed, and each one's events."""
    managers, events = [], []
    for _ in range(2):
        log: list = []
        manager = make_manager(life_cycles, pages=256, block_size=4, policy=policy, events=log)
        manager.watch_page_tables()
        for i, length in enumerate(lengths):
            manager.add_request(f"r{i}", tokens(i, length), conversation_id=f"c{i}")
            manager.admit(f"r{i}", length)
        managers.append(manager)
        events.append(log)
    return managers, events


def state_of(manager, ids):
    requests = manager._requests
    return (
        {r: {lc: manager.page_table(r, lc) for lc in manager.life_cycles} for r in ids},
        {r: manager.progress(r) for r in ids},
        {r: list(requests[r].sequence.hashes) for r in ids},
        {r: requests[r].sequence.num_tokens for r in ids},
        {name: pool.num_available() for name, pool in manager.pools.items()},
    )


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 14), min_size=1, max_size=6),
    steps=st.lists(
        st.tuples(st.lists(st.integers(0, 2**32 - 1), min_size=6, max_size=6), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    every_block=st.booleans(),
    life_cycles=st.sampled_from([HYBRID, FULL]),
)
def test_batched_decode_calls_equal_per_request_calls(lengths, steps, every_block, life_cycles):
    (batched, single), (batched_events, single_events) = decoding_managers(
        lengths, AllReusable() if every_block else PerRequest(), life_cycles
    )
    ids = [f"r{i}" for i in range(len(lengths))]
    # The prompt's commit: the first step's chunk is the whole prompt.
    counts = list(lengths)
    for sampled, end_contexts in steps:
        batched.commit_all(ids, counts)
        for r, count in zip(ids, counts, strict=True):
            single.commit(r, count)
        if end_contexts:  # the step that computed a prompt ends its context
            for manager in (batched, single):
                for r in ids:
                    if not manager.progress(r).context_done:
                        manager.finish_context(r)
        picked = sampled[: len(ids)]
        batched.append_tokens_all(ids, picked)
        for r, token in zip(ids, picked, strict=True):
            single.append_tokens(r, [token])
        assert state_of(batched, ids) == state_of(single, ids)
        assert batched_events == single_events
        assert batched._take_table_changes() == single._take_table_changes()
        for manager in (batched, single):
            manager.check_integrity()
            manager.allocate_all(ids, 1)
        counts = [count + 1 for count in batched.computed_tokens(ids)]


def test_commit_all_is_all_or_nothing():
    (manager, _), _ = decoding_managers([5, 9, 6], PerRequest())
    ids = ["r0", "r1", "r2"]
    before = state_of(manager, ids)
    with pytest.raises(ValueError, match="computed tokens must go"):
        manager.commit_all(ids, [5, 9, 99])  # the last one has no pages that far
    with pytest.raises(ValueError, match="more than once"):
        manager.commit_all(["r0", "r0"], [4, 5])
    assert state_of(manager, ids) == before
    manager.check_integrity()


def test_append_tokens_all_is_all_or_nothing():
    (manager, _), _ = decoding_managers([5, 9], PerRequest())
    ids = ["r0", "r1"]
    before = state_of(manager, ids)
    with pytest.raises(ValueError, match="must lie in"):
        manager.append_tokens_all(ids, [3, 2**32])
    with pytest.raises(KeyError):
        manager.append_tokens_all(["r0", "gone"], [3, 4])
    with pytest.raises(ValueError, match="2 requests but 1 tokens"):
        manager.append_tokens_all(ids, [3])
    assert state_of(manager, ids) == before
