"""Admitting a prompt computed elsewhere: pages only where decoding reads or the policy commits.

Block 4, window 8 tokens, checkpoint margin 8, prompt 30 tokens (7 full blocks and a partial
one): window blocks with pages are the live ones at 30 (5..7), the endpoint window (5, 6) and
the checkpoint window at 20 (3, 4); blocks 0..2 stay NULL.
"""

import pytest
from kv_factories import run_turn, tokens
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle, PrivateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import AllReusable, PerRequest

BLOCK = 4
HYBRID = (FullLifeCycle("full"), WindowLifeCycle("win", 8))
PROMPT = tokens(3, 30)


def manager_with(win_pages: int = 16, policy=None, life_cycles=HYBRID) -> KVCacheManager:
    """A manager with 16 pages per pool but `win_pages` in the window pool."""
    pages = {lc.name: 16 for lc in life_cycles} | {"win": win_pages}
    config = KVStoreConfig(
        BLOCK, life_cycles, pages, policy or PerRequest(), checkpoint_margin_tokens=8
    )
    return KVCacheManager(config)


def test_window_gets_pages_only_for_live_endpoint_and_checkpoint_blocks():
    """Pages for every prompt block would make a window pool hold the whole prompt."""
    manager = manager_with()
    manager.add_request("r", PROMPT)
    allocation = manager.admit_computed("r")
    assert manager.page_table("r", "win") == (0, 0, 0, 1, 2, 3, 4, 5)
    assert manager.page_table("r", "full") == (1, 2, 3, 4, 5, 6, 7, 8)
    assert allocation.new_pages == {"full": (1, 2, 3, 4, 5, 6, 7, 8), "win": (1, 2, 3, 4, 5)}
    assert allocation.num_tokens_with_pages == 32 and allocation.num_reused_tokens == 0
    assert manager.progress("r").checkpoint_tokens == 20
    manager.check_integrity()


def test_commit_and_context_end_keep_exactly_the_endpoint_window():
    """A computed prompt that committed or kept other blocks would leak or lose reuse."""
    manager = manager_with()
    manager.add_request("r", PROMPT)
    manager.admit_computed("r")
    manager.commit("r", 30)
    assert manager.page_table("r", "win") == (0, 0, 0, 1, 2, 3, 4, 5)  # 3, 4 kept
    manager.finish_context("r")
    assert manager.page_table("r", "win") == (0, 0, 0, 0, 0, 3, 4, 5)
    assert manager.pools["win"].cached_pages() == [1, 2]  # the checkpoint window
    manager.finish_request("r")
    manager.check_integrity()
    manager.add_request("again", PROMPT)
    match = manager.match("again")
    assert match.num_reusable_tokens == 28
    assert match.pages["win"] == (0, 0, 0, 0, 0, 3, 4)
    manager.check_integrity()


def test_fits_a_window_pool_smaller_than_the_prompt():
    """Checking room for every prompt block refuses prompts a window pool can decode."""
    manager = manager_with(win_pages=6)  # 5 usable pages, 8 prompt blocks
    manager.add_request("r", PROMPT)
    assert not manager.can_admit("r", 30)
    assert manager.can_admit_computed("r")
    manager.admit_computed("r")
    assert manager.pools["win"].num_available() == 0
    manager.check_integrity()


def test_refuses_without_room_and_changes_nothing():
    """A half-done admission would leave pages held by a request that never runs."""
    manager = manager_with(win_pages=5)  # 4 usable pages, 5 needed
    manager.add_request("r", PROMPT)
    assert not manager.can_admit_computed("r")
    with pytest.raises(ValueError, match="cannot be admitted as computed elsewhere"):
        manager.admit_computed("r")
    assert manager.page_table("r", "win") == () and not manager.progress("r").admitted
    assert manager.pools["full"].num_free == 15
    manager.check_integrity()


def test_reused_prefix_is_referenced_and_only_later_blocks_get_pages():
    """New pages below the held prefix would duplicate blocks this rank already holds."""
    manager = manager_with()
    run_turn(manager, "t1", PROMPT[:16])  # commits full 0..3, window endpoint 2, 3
    manager.check_integrity()
    manager.add_request("t2", PROMPT)
    allocation = manager.admit_computed("t2")
    assert allocation.num_reused_tokens == 16
    assert manager.page_table("t2", "full") == (1, 2, 3, 4, 5, 6, 7, 8)
    # Blocks 2, 3 are the held window (pages 3, 4 of turn 1; block 3 is also in the checkpoint
    # window 3, 4); block 4 of that window and the live blocks 5..7 get new pages (turn 1's
    # slid-out pages 1, 2 went to the back of the free list).
    assert allocation.new_pages["win"] == (5, 6, 7, 8)
    assert manager.page_table("t2", "win") == (0, 0, 3, 4, 5, 6, 7, 8)
    assert manager.pools["win"].ref_count(3) == manager.pools["win"].ref_count(4) == 1
    manager.check_integrity()


def test_all_reusable_gives_every_block_a_page():
    """all_reusable commits every block, so leaving some out would lose that policy's reuse."""
    manager = manager_with(policy=AllReusable())
    manager.add_request("r", PROMPT)
    manager.admit_computed("r")
    assert manager.page_table("r", "win") == (1, 2, 3, 4, 5, 6, 7, 8)
    manager.check_integrity()


def test_private_life_cycle_keeps_every_block():
    """A private life cycle's scratch is read for the whole prompt: no block may be NULL."""
    manager = manager_with(life_cycles=(*HYBRID, PrivateLifeCycle("scratch")))
    manager.add_request("r", PROMPT)
    manager.admit_computed("r")
    assert manager.page_table("r", "scratch") == (1, 2, 3, 4, 5, 6, 7, 8)
    manager.check_integrity()
