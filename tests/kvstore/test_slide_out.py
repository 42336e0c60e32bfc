"""Slid-out pages: each commit releases exactly the blocks that left the window, once."""

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_factories import tokens
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerRequest

BLOCK = 4
WINDOW_ONLY = (WindowLifeCycle("win", 8),)


def window_manager(life_cycles=WINDOW_ONLY, pages=16, margin=8):
    """A per_request manager whose checkpoint sits `margin` tokens before the prompt end."""
    config = KVStoreConfig(
        BLOCK,
        tuple(life_cycles),
        {lc.name: pages for lc in life_cycles},
        PerRequest(),
        checkpoint_margin_tokens=margin,
    )
    return KVCacheManager(config)


def decode(manager, request_id, count):
    """`count` decode steps of one token each."""
    for _ in range(count):
        done = manager.progress(request_id).num_computed_tokens
        manager.allocate(request_id, 1)
        manager.append_tokens(request_id, [7])
        manager.commit(request_id, done + 1)


def test_kept_checkpoint_pages_wait_for_context_end_then_go_to_the_lru():
    """Kept checkpoint blocks freed early lose the resend's reuse; never freed leak pages."""
    manager = window_manager()
    manager.add_request("r", tokens(0, 24))
    manager.admit("r", 8)
    manager.commit("r", 8)
    for done in (16, 24):
        manager.allocate("r", 8)
        manager.commit("r", done)
    assert manager.progress("r").checkpoint_tokens == 16
    assert manager.page_table("r", "win") == (0, 0, 3, 4, 5, 6)  # blocks 2, 3 kept
    manager.finish_context("r")
    assert manager.page_table("r", "win") == (0, 0, 0, 0, 5, 6)
    assert manager.pools["win"].cached_pages() == [3, 4]
    manager.check_integrity()


def test_decode_commits_release_exactly_the_slid_out_pages():
    """A decode commit that misses or repeats a release corrupts ref counts or leaks pages."""
    manager = window_manager()
    manager.add_request("r", tokens(0, 24))
    manager.admit("r", 24)
    manager.commit("r", 24)
    manager.finish_context("r")
    assert manager.pools["win"].cached_pages() == [3, 4]  # checkpoint blocks 2, 3
    decode(manager, "r", 3)
    assert manager.page_table("r", "win") == (0, 0, 0, 0, 5, 6, 7)  # 27 tokens: block 4 live
    decode(manager, "r", 9)
    assert manager.page_table("r", "win") == (0, 0, 0, 0, 0, 0, 0, 8, 9)
    assert manager.pools["win"].cached_pages() == [3, 4, 5, 6]  # committed: checkpoint, endpoint
    assert manager.pools["win"].num_free == 15 - 2 - 4  # page 7 (block 6, uncommitted) is free
    manager.check_integrity()
    manager.finish_request("r")
    manager.check_integrity()


def expected_table(manager, request_id, allocated, name):
    """Each allocated page, or NULL where its block slid out and is not kept, from the rules."""
    life_cycle, progress = manager.life_cycles[name], manager.progress(request_id)
    prompt_len = manager._state(request_id).prompt_len
    keep = set(life_cycle.resume_blocks(prompt_len // BLOCK, BLOCK))
    if progress.checkpoint_tokens is not None:
        keep |= set(life_cycle.resume_blocks(progress.checkpoint_tokens // BLOCK, BLOCK))
    first_live = life_cycle.first_live_block(progress.num_computed_tokens, BLOCK)
    return tuple(
        NULL_PAGE if index < first_live and (progress.context_done or index not in keep) else page
        for index, page in enumerate(allocated)
    )


def check_against_rules(manager, allocated):
    """Page tables match the rules and every slid-out page has no holder left."""
    for name, pages in allocated.items():
        table = manager.page_table("r", name)
        assert table == expected_table(manager, "r", pages, name), name
        gone = set(pages) - set(table)
        assert all(manager.pools[name].ref_count(page) == 0 for page in gone), name
    manager.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    window=st.sampled_from([4, 8, 12]),
    prompt_len=st.integers(1, 40),
    chunk=st.integers(1, 12),
    margin=st.sampled_from([0, 4, 8, 512]),
    decodes=st.integers(0, 20),
)
def test_released_pages_follow_the_rules_at_every_commit(
    window, prompt_len, chunk, margin, decodes
):
    """Incremental release must free exactly what a full rescan of the page table would."""
    life_cycles = (FullLifeCycle("full"), WindowLifeCycle("win", window), StateLifeCycle("ssm"))
    manager = window_manager(life_cycles, pages=32, margin=margin)
    manager.add_request("r", tokens(1, prompt_len))
    allocated = {name: [] for name in manager.life_cycles}

    def grow(allocation):  # the new blocks' entries as allocated (a state hole is NULL_PAGE)
        for name in allocation.new_pages:
            table = manager.page_table("r", name)
            new = table[len(allocated[name]) :]
            if name == "ssm":  # pages only at its commit blocks and the running state
                stored = manager._state("r").commit_blocks[name] | {len(table) - 1}
                first = len(allocated[name])
                paged = {first + i for i, page in enumerate(new) if page != NULL_PAGE}
                assert paged == {i for i in stored if first <= i < len(table)}, (paged, stored)
            allocated[name].extend(new)

    done = min(chunk, prompt_len)
    grow(manager.admit("r", done))
    manager.commit("r", done)
    check_against_rules(manager, allocated)
    while done < prompt_len:
        step = min(chunk, prompt_len - done)
        grow(manager.allocate("r", step))
        done += step
        manager.commit("r", done)
        check_against_rules(manager, allocated)
    manager.finish_context("r")
    check_against_rules(manager, allocated)
    for _ in range(decodes):
        grow(manager.allocate("r", 1))
        manager.append_tokens("r", [5])
        done += 1
        manager.commit("r", done)
        check_against_rules(manager, allocated)
    manager.finish_request("r")
    manager.check_integrity()
