"""per_conversation(max_num_turns): a conversation holds exactly its last turns' endpoints."""

from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import PerConversation, make_reuse_policy

BLOCK = 4
LIFE_CYCLES = [FullLifeCycle("full"), WindowLifeCycle("win", 8), StateLifeCycle("ssm")]


def endpoint_pages(manager, prompt):
    """Pages of the window endpoint and state snapshot at the prompt end, from block ids."""
    hashes = block_hashes(prompt, BLOCK)
    win = {manager.pools["win"].lookup(h) for h in hashes[-2:]}
    return win, {manager.pools["ssm"].lookup(hashes[-1])}


def in_use(pool):
    return {page for page in range(1, pool.num_pages) if pool.ref_count(page) > 0}


def test_turn_five_holds_exactly_the_last_three_endpoints():
    """Retention beyond max_num_turns would starve the pools; less would lose promised reuse."""
    manager = make_manager(LIFE_CYCLES, pages=64, policy=PerConversation(max_num_turns=3))
    prompt, endpoints = [], []
    for turn in range(5):
        prompt = prompt + tokens(turn, 16)
        run_turn(manager, f"t{turn + 1}", prompt, "c", chunk=8)
        endpoints.append(endpoint_pages(manager, prompt))
        manager.check_integrity()
    assert [t.request_id for t in manager.retained_turns("c")] == ["t3", "t4", "t5"]
    kept_win = set().union(*(win for win, _ in endpoints[2:]))
    kept_ssm = set().union(*(ssm for _, ssm in endpoints[2:]))
    assert in_use(manager.pools["win"]) == kept_win and len(kept_win) == 6
    assert in_use(manager.pools["ssm"]) == kept_ssm and len(kept_ssm) == 3
    assert len(in_use(manager.pools["full"])) == len(prompt) // BLOCK
    for win, ssm in endpoints[:2]:
        assert all(manager.pools["win"].ref_count(page) == 0 for page in win)
        assert all(manager.pools["ssm"].ref_count(page) == 0 for page in ssm)


def test_dropped_turns_return_their_pages_to_the_free_list():
    """An old turn's endpoint, held by nobody else, must be freed, not linger as cache."""
    manager = make_manager(LIFE_CYCLES, pages=64, policy=make_reuse_policy("per_conversation"))
    prompt = tokens(0, 16)
    run_turn(manager, "t1", prompt, "c")
    old_win, _ = endpoint_pages(manager, prompt)
    for turn in (1, 2):
        prompt = prompt + tokens(turn, 16)
        run_turn(manager, f"t{turn + 1}", prompt, "c")
    assert all(manager.pools["win"].page_hash(page) is None for page in old_win)
    manager.drop_conversation("c")
    assert manager.pools["win"].num_in_use == 0 and manager.pools["full"].num_in_use == 0
    manager.check_integrity()


def test_retained_endpoint_survives_pressure_that_evicts_cache():
    """A retained turn's endpoint must not be evicted by other requests' allocations."""
    manager = make_manager(LIFE_CYCLES, pages=24, policy=PerConversation(max_num_turns=1))
    prompt = tokens(0, 16)
    run_turn(manager, "t1", prompt, "c")
    for other in range(4):
        run_turn(manager, f"o{other}", tokens(100 + other, 20))
    manager.add_request("t2", prompt + tokens(1, 8), "c")
    assert manager.match("t2").num_reusable_tokens == 16
    manager.finish_request("t2")
    manager.check_integrity()
