"""per_conversation(keep_root=True): the first turn's endpoints stay beside the last turns."""

import pytest
from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerConversation, make_reuse_policy

BLOCK = 4
LIFE_CYCLES = [FullLifeCycle("full"), WindowLifeCycle("win", 8), StateLifeCycle("ssm")]


def endpoint_pages(manager, prompt):
    """Pages of the window endpoint and the state snapshot at the prompt end."""
    hashes = block_hashes(prompt, BLOCK)
    win = {manager.pools["win"].lookup(h) for h in hashes[-2:]}
    return win, {manager.pools["ssm"].lookup(hashes[-1])}


def in_use(pool):
    return {page for page in range(1, pool.num_pages) if pool.ref_count(page) > 0}


def run_conversation(manager, num_turns, conversation="c"):
    """Turns that each append 16 tokens; the prompts and their endpoint pages."""
    prompt, prompts, endpoints = [], [], []
    for turn in range(num_turns):
        prompt = prompt + tokens(turn, 16)
        run_turn(manager, f"t{turn + 1}", prompt, conversation, chunk=8)
        prompts.append(prompt)
        endpoints.append(endpoint_pages(manager, prompt))
        manager.check_integrity()
    return prompts, endpoints


def test_root_survives_the_drop_plans_of_later_turns():
    """Without it the first turn's endpoint falls out with the turns beyond max_num_turns."""
    manager = make_manager(LIFE_CYCLES, 64, BLOCK, PerConversation(2, keep_root=True))
    _, endpoints = run_conversation(manager, 5)
    assert [t.request_id for t in manager.retained_turns("c")] == ["t1", "t4", "t5"]
    kept = [endpoints[0], endpoints[3], endpoints[4]]
    assert in_use(manager.pools["win"]) == set().union(*(win for win, _ in kept))
    assert in_use(manager.pools["ssm"]) == set().union(*(ssm for _, ssm in kept))
    assert len(in_use(manager.pools["win"])) == 6 and len(in_use(manager.pools["ssm"])) == 3
    for win, ssm in endpoints[1:3]:
        assert all(manager.pools["win"].page_hash(page) is None for page in win)
        assert all(manager.pools["ssm"].page_hash(page) is None for page in ssm)
    manager.check_integrity()


def test_early_turns_are_not_retained_twice():
    """The root is not also counted among the recent turns, nor freed while it is the root."""
    manager = make_manager(LIFE_CYCLES, 64, BLOCK, PerConversation(2, keep_root=True))
    _, endpoints = run_conversation(manager, 3)
    assert [t.request_id for t in manager.retained_turns("c")] == ["t1", "t2", "t3"]
    assert in_use(manager.pools["win"]) == set().union(*(win for win, _ in endpoints))
    manager.check_integrity()


@pytest.mark.parametrize(("keep_root", "reused"), [(True, 16), (False, 0)])
def test_a_reset_turn_resumes_at_the_root_endpoint(keep_root, reused):
    """A turn that keeps only the first turn's prompt must resume at its end with the root."""
    manager = make_manager(LIFE_CYCLES, 64, BLOCK, PerConversation(2, keep_root=keep_root))
    prompts, _ = run_conversation(manager, 5)
    reset = prompts[0] + tokens(99, 12)
    assert run_turn(manager, "reset", reset, "c").num_reusable_tokens == reused
    manager.check_integrity()


def test_a_reset_turn_resumes_at_the_root_checkpoint():
    """A reset that rewrites the first turn's tail must resume at that turn's checkpoint."""
    life_cycles = (FullLifeCycle("full"), WindowLifeCycle("win", 8, replay_tokens=4))
    config = KVStoreConfig(
        BLOCK,
        life_cycles,
        {"full": 64, "win": 64},
        PerConversation(1, keep_root=True),
        checkpoint_margin_tokens=4,
    )
    manager = KVCacheManager(config)
    first = tokens(0, 32)  # checkpoint: (32 - 4 replay - 4 margin) // 4 * 4 = 24
    run_turn(manager, "t1", first, "c")
    assert manager.retained_turns("c")[0].request_id == "t1"
    prompt = first
    for turn in range(1, 4):
        prompt = prompt + tokens(turn, 16)
        run_turn(manager, f"t{turn + 1}", prompt, "c")
    reset = first[:26] + tokens(99, 20)
    assert run_turn(manager, "reset", reset, "c").num_reusable_tokens == 24
    manager.check_integrity()


def test_drop_conversation_frees_the_root():
    """A root that outlives its conversation would leak its pages for good."""
    manager = make_manager(LIFE_CYCLES, 64, BLOCK, PerConversation(1, keep_root=True))
    _, endpoints = run_conversation(manager, 3)
    plans = manager.drop_conversation("c")
    assert [plan.request_id for plan in plans] == ["t1", "t3"]
    assert set(plans[0].dropped["win"]) == endpoints[0][0]
    assert all(pool.num_in_use == 0 for pool in manager.pools.values())
    manager.check_integrity()


def test_release_conversation_hands_the_root_to_the_lru():
    """Under pressure the root must give its refs back with the other retained turns."""
    manager = make_manager(LIFE_CYCLES, 64, BLOCK, PerConversation(1, keep_root=True))
    _, endpoints = run_conversation(manager, 3)
    releases = manager.release_conversation("c")
    assert [release.request_id for release in releases] == ["t1", "t3"]
    assert set(releases[0].evictable["win"]) == endpoints[0][0]
    assert manager.retained_turns("c") == () and not manager.can_release_conversation("c")
    assert all(pool.num_in_use == 0 for pool in manager.pools.values())
    manager.check_integrity()


def test_policy_counts_the_root_among_retained_turns():
    """Sizing reads `retained_turns`; leaving the root out would under-size the pools."""
    policy = make_reuse_policy("per_conversation", max_num_turns=5, keep_root=True)
    assert (policy.retained_turns, policy.recent_turns, policy.keep_root) == (6, 5, True)
    assert PerConversation(5).retained_turns == 5
