"""release_conversation: under pressure a conversation's retained pages go to the LRU, not away."""

import pytest
from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.events import KVEventKind
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.tiers.build import TierConfig, build_tiers

BLOCK = 4
LIFE_CYCLES = [FullLifeCycle("full"), WindowLifeCycle("win", 8), StateLifeCycle("ssm")]


def retaining_manager(events=None):
    """64 pages per pool, two retained turns per conversation, block size 4."""
    return make_manager(
        LIFE_CYCLES, pages=64, policy=PerConversation(max_num_turns=2), events=events
    )


def counts(manager):
    """(free, cached, in use) per pool."""
    return {
        name: (pool.num_free, pool.num_cached, pool.num_in_use)
        for name, pool in manager.pools.items()
    }


def test_release_makes_retained_pages_evictable_without_freeing_them():
    """Freeing here would lose the prefix; keeping the refs would not relieve the pressure."""
    manager = retaining_manager()
    run_turn(manager, "t1", tokens(0, 16), "c")
    assert counts(manager) == {"full": (59, 0, 4), "win": (61, 0, 2), "ssm": (62, 0, 1)}
    (release,) = manager.release_conversation("c")
    assert {name: len(pages) for name, pages in release.evictable.items()} == {
        "full": 4,
        "win": 2,
        "ssm": 1,
    }
    assert release.released == release.evictable
    assert counts(manager) == {"full": (59, 4, 0), "win": (61, 2, 0), "ssm": (62, 1, 0)}
    assert manager.retained_turns("c") == ()
    manager.check_integrity()


def test_a_released_turn_is_still_matched_by_the_next_turn():
    """Release must leave the blocks findable, or the conversation's next turn recomputes."""
    manager = retaining_manager()
    prompt = tokens(0, 16)
    run_turn(manager, "t1", prompt, "c")
    manager.release_conversation("c")
    manager.add_request("t2", prompt + tokens(1, 8), "c")
    assert manager.match("t2").num_reusable_tokens == 16
    manager.finish_request("t2")
    manager.check_integrity()


def test_pages_a_live_request_holds_stay_in_use():
    """A release must never make evictable a page a running request still reads."""
    manager = retaining_manager()
    prompt = tokens(0, 16)
    run_turn(manager, "t1", prompt, "c")
    manager.add_request("t2", prompt + tokens(1, 8), "c")
    manager.admit("t2", 8)
    (release,) = manager.release_conversation("c")
    assert {name: len(pages) for name, pages in release.released.items()} == {
        "full": 4,
        "win": 2,
        "ssm": 1,
    }
    assert release.evictable == {"full": (), "win": (), "ssm": ()}
    assert {name: c[1] for name, c in counts(manager).items()} == {"full": 0, "win": 0, "ssm": 0}
    manager.finish_request("t2")
    manager.check_integrity()


def test_release_of_two_turns_gives_each_turn_its_own_record():
    """The caller counts relieved pages per turn; a merged or missing turn miscounts them."""
    manager = retaining_manager()
    prompt = tokens(0, 16)
    run_turn(manager, "t1", prompt, "c")
    run_turn(manager, "t2", prompt + tokens(1, 16), "c")
    releases = manager.release_conversation("c")
    assert [r.request_id for r in releases] == ["t1", "t2"]
    # t2 shares t1's 4 full blocks: they become evictable with the last holder, t2.
    assert [len(r.evictable["full"]) for r in releases] == [0, 8]
    assert manager.pools["full"].num_cached == 8 and manager.pools["full"].num_in_use == 0
    manager.check_integrity()


def test_release_announces_no_removed_blocks():
    """Routers would stop sending the conversation here although its blocks are still cached."""
    events = []
    manager = retaining_manager(events)
    run_turn(manager, "t1", tokens(0, 16), "c")
    events.clear()
    manager.release_conversation("c")
    assert events == []


def test_a_conversation_without_retained_turns_cannot_be_released():
    """Releasing twice would release refs the conversation no longer holds."""
    manager = retaining_manager()
    run_turn(manager, "t1", tokens(0, 16), "c")
    assert manager.can_release_conversation("c")
    manager.release_conversation("c")
    assert not manager.can_release_conversation("c")
    assert not manager.can_release_conversation("never")
    with pytest.raises(ValueError, match="'c' retains no turns"):
        manager.release_conversation("c")
    manager.check_integrity()


def tiered_manager():
    """Full life cycle only: 8 device pages (7 usable), 16 host pages, byte-less tiers."""
    store = KVStoreConfig(
        BLOCK, (FullLifeCycle("full"),), {"full": 8}, PerConversation(1), checkpoint=False
    )
    tiers = build_tiers(store, TierConfig({"full": 16}, {"full": 0}))
    return KVCacheManager(store, tiers=tiers)


@pytest.mark.parametrize(("give_back", "where"), [("release", "host"), ("drop", None)])
def test_released_pages_are_offloaded_when_evicted_dropped_ones_are_lost(give_back, where):
    """Release under pressure must keep the prefix on host; drop (conversation over) need not."""
    manager = tiered_manager()
    prompt = tokens(0, 16)
    run_turn(manager, "t1", prompt, "c")
    getattr(manager, f"{give_back}_conversation")("c")
    run_turn(manager, "flood", tokens(9, 28))  # 7 blocks: every device page
    manager.add_request("t2", prompt + tokens(1, 4), "c")
    match = manager.match("t2")
    if where is None:
        assert match.num_reusable_blocks == 0
    else:
        assert match.locations["full"] == (where,) * 4
    manager.finish_request("t2")
    manager.check_integrity()


def test_drop_still_frees_and_announces_removal():
    """drop_conversation (the conversation ended) must keep freeing pages, unlike release."""
    events = []
    manager = retaining_manager(events)
    run_turn(manager, "t1", tokens(0, 16), "c")
    events.clear()
    manager.drop_conversation("c")
    assert counts(manager) == {"full": (63, 0, 0), "win": (63, 0, 0), "ssm": (63, 0, 0)}
    assert {event.kind for event in events} == {KVEventKind.REMOVED} and len(events) == 7
    manager.check_integrity()
