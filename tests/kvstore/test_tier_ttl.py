"""A conversation released inside its client's cache TTL keeps its blocks on host and disk
past a flood of other blocks, and loses that shelter when the TTL runs out."""

from __future__ import annotations

import pytest
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.tiers.tier_index import TierIndex
from tier_factories import make_tiered, prompt_of, serve


def test_the_host_tier_evicts_kept_blocks_after_every_other_unpinned_one():
    kept = {1}
    index = TierIndex("host", {"full": 2}, lambda block_hash: block_hash in kept)
    for block_hash in (1, 2):
        index.insert("full", block_hash)
    assert index.insert("full", 3)[1] == [(2, 1)]  # 1 is older, but inside its TTL
    index.pin("full", 3)
    assert index.insert("full", 4)[1] == [(1, 0)]  # nothing else unpinned: it goes after all
    assert index.hashes("full") == [3, 4]


@pytest.mark.parametrize(("keep_seconds", "shelter"), [(300.0, "host"), (0.0, "disk")])
def test_a_released_conversation_inside_its_ttl_stays_on_host_through_a_flood(
    keep_seconds, shelter
):
    now = [0.0]
    manager = make_tiered(
        device_pages=5,
        host_pages=6,
        policy=PerConversation(max_num_turns=1),
        clock=lambda: now[0],
    )
    conversation = prompt_of(1)  # four blocks
    serve(manager, "turn", conversation, "c")
    manager.release_conversation("c", keep_seconds=keep_seconds)
    for seed in range(2, 6):  # each pushes four blocks through the device onto the host
        serve(manager, f"flood{seed}", prompt_of(seed))
    manager.add_request("next", [*conversation, 7])
    assert set(manager.match("next").locations["full"]) == {shelter}
    manager.finish_request("next")
    now[0] = 301.0  # the TTL ran out: the next flood evicts it by age like any block
    for seed in range(6, 8):
        serve(manager, f"flood{seed}", prompt_of(seed))
    manager.add_request("later", [*conversation, 7])
    assert set(manager.match("later").locations["full"]) == {"disk"}
    manager.finish_request("later")
    manager.check_integrity()
    manager.tiers.close()
