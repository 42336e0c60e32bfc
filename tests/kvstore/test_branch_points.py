"""Branch points: a reset turn commits the window where its full match ends; later resets reuse it.

Scenario (block 4, window 8 with replay 4, margin 4, so C = (prompt_len - 8) // 4 * 4): every
prompt starts with a 24-token system prompt (blocks 0..5) that no window endpoint ever covers.
"""

import pytest
from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import AllReusable, PerConversation, PerRequest, make_reuse_policy
from kvfleet.kvstore.results import TurnRecord
from kvfleet.kvstore.retention import RetainedTurns

BLOCK, MARGIN = 4, 4
LIFE_CYCLES = [
    FullLifeCycle("full"),
    WindowLifeCycle("win", 8, replay_tokens=4),
    StateLifeCycle("ssm"),
]
SYSTEM = tokens(0, 24)


def manager_for(policy):
    return make_manager(LIFE_CYCLES, 96, BLOCK, policy, checkpoint_margin_tokens=MARGIN)


def reset_conversation(manager):
    """t1, t2 grow; t3 resets to the system prompt; t4 grows t3. Returns the prompts."""
    t1 = SYSTEM + tokens(1, 16)
    t2 = t1 + tokens(2, 16)
    t3 = SYSTEM + tokens(3, 20)
    t4 = t3 + tokens(4, 16)
    for number, prompt in enumerate((t1, t2, t3, t4), start=1):
        run_turn(manager, f"t{number}", prompt, "c")
        manager.check_integrity()
    return t1, t2, t3, t4


def branches(manager, conversation="c"):
    return [t for t in manager.retained_turns(conversation) if t.branch_tokens is not None]


@pytest.mark.parametrize(("keep", "reused"), [(1, 24), (0, 0)])
def test_a_later_reset_resumes_at_the_branch_point(keep, reused):
    """Without the branch record a second reset to the system prompt would reuse nothing."""
    manager = manager_for(PerConversation(2, keep_branch_points=keep))
    reset_conversation(manager)
    assert run_turn(manager, "t5", SYSTEM + tokens(5, 20), "c").num_reusable_tokens == reused
    manager.check_integrity()


def test_the_resetting_turn_reuses_nothing_and_plans_its_branch_point():
    """The first reset finds the full blocks but no window at 24: it plans b = 24 and C = 36."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c")
    manager.add_request("t3", SYSTEM + tokens(3, 20), "c")
    match = manager.match("t3")
    assert (match.num_reusable_tokens, match.num_whole_prefix_blocks) == (0, 6)
    manager.admit("t3", 44)
    progress = manager.progress("t3")
    assert (progress.branch_tokens, progress.checkpoint_tokens) == ((24,), 36)
    manager.finish_request("t3")
    manager.check_integrity()


def test_branch_record_holds_the_window_snapshot_and_full_prefix_at_the_branch():
    """A record holding other blocks than full 0..5, window 4..5, state 5 would not resume t5."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    _, _, t3, _ = reset_conversation(manager)
    (branch,) = branches(manager)
    hashes = block_hashes(t3, BLOCK)
    assert (branch.request_id, branch.branch_tokens) == ("t3", 24)
    # t1 computed the system prompt first: pages 1..6 of the full pool.
    assert branch.pages["full"] == (1, 2, 3, 4, 5, 6)
    expected = {
        name: tuple(manager.pools[name].lookup(hashes[i]) for i in indices)
        for name, indices in (("win", (4, 5)), ("ssm", (5,)))
    }
    assert {name: branch.pages[name] for name in expected} == expected
    assert None not in expected["win"] + expected["ssm"]
    assert all(manager.pools["win"].ref_count(page) == 1 for page in expected["win"])
    manager.add_request("t5", SYSTEM + tokens(5, 20), "c")
    match = manager.match("t5")
    assert match.pages["win"][4:] == expected["win"] and match.pages["ssm"][5:] == expected["ssm"]
    manager.finish_request("t5")
    manager.check_integrity()


def test_no_branch_point_within_replay_and_margin_of_the_prompt_end():
    """A full run ending at/after C is the checkpoint's job; a branch there would be a duplicate."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    t1 = SYSTEM + tokens(1, 16)
    run_turn(manager, "t1", t1, "c")
    manager.add_request("t2", t1[:36] + tokens(2, 8), "c")  # full run 36 = C; windows resume at 32
    assert manager.match("t2").num_whole_prefix_blocks == 9
    manager.admit("t2", 12)
    assert manager.progress("t2").num_reused_tokens == 32
    assert manager.progress("t2").branch_tokens == ()
    manager.finish_request("t2")
    manager.check_integrity()


@pytest.mark.parametrize(
    "policy",
    [
        AllReusable(),
        PerRequest(),
        PerConversation(2),
        PerConversation(2, keep_branch_points=2, discover_branch_points=False),
    ],
)
def test_policies_without_branch_points_plan_none(policy):
    """all_reusable commits every window anyway; per_request and the default retain no branch;
    with discovery off an unhinted reset plans none (hints only: the engine's default)."""
    manager = manager_for(policy)
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c")
    manager.add_request("t3", SYSTEM + tokens(3, 20), "c")
    manager.admit("t3", 44)
    assert manager.progress("t3").branch_tokens == ()
    manager.finish_request("t3")
    manager.check_integrity()


def test_one_branch_record_replaces_the_other():
    """With keep_branch_points=1 a new branch's record must push the older one out (and free it)."""
    manager = manager_for(PerConversation(1, keep_branch_points=1))
    run_turn(manager, "t1", SYSTEM + tokens(1, 20), "c")
    run_turn(manager, "t2", SYSTEM + tokens(2, 20), "c")
    assert [b.branch_tokens for b in branches(manager)] == [24]
    old_window = branches(manager)[0].pages["win"]
    manager.add_request("t3", SYSTEM[:16] + tokens(3, 28), "c")
    manager.admit("t3", 44)
    manager.commit("t3", 44)
    plans = manager.finish_context("t3")
    manager.finish_request("t3")
    assert [plan.request_id for plan in plans] == ["t2", "t2"]
    assert set(plans[1].dropped["win"]) == set(old_window)
    assert [(b.request_id, b.branch_tokens) for b in branches(manager)] == [("t3", 16)]
    manager.check_integrity()


def test_a_resumed_branch_outlives_a_newer_unused_one():
    """Branch records are least recently used first: the branch resets come back to must survive."""
    manager = manager_for(PerConversation(1, keep_branch_points=2))
    run_turn(manager, "t1", SYSTEM + tokens(1, 20), "c")
    run_turn(manager, "t2", SYSTEM + tokens(2, 20), "c")  # branch at 24
    run_turn(manager, "t3", SYSTEM[:16] + tokens(3, 28), "c")  # branch at 16
    assert run_turn(manager, "t4", SYSTEM + tokens(4, 20), "c").num_reusable_tokens == 24
    assert [b.branch_tokens for b in branches(manager)] == [16, 24]
    run_turn(manager, "t5", SYSTEM[:8] + tokens(5, 36), "c")  # branch at 8: 16 falls out
    assert [(b.request_id, b.branch_tokens) for b in branches(manager)] == [("t2", 24), ("t5", 8)]
    manager.check_integrity()


@pytest.mark.parametrize(("hints", "reused"), [((24,), 24), ((26,), 24), ((), 0)])
def test_a_hinted_first_turn_lets_the_first_reset_resume(hints, reused):
    """A hint at the system prompt's end (floored to a block) keeps a window there on the first
    turn, so the conversation's first reset already resumes; without it, it reuses nothing."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c", branch_hints=hints)
    assert [b.branch_tokens for b in branches(manager)] == [h // BLOCK * BLOCK for h in hints]
    run_turn(manager, "t2", SYSTEM + tokens(1, 16) + tokens(2, 16), "c")
    assert run_turn(manager, "t3", SYSTEM + tokens(3, 20), "c").num_reusable_tokens == reused
    manager.check_integrity()


def test_each_hint_is_a_branch_record_of_its_own():
    """Hints at the tools' end (16) and the system prompt's end (24): a reset to either resumes
    there; one record for both would lose the shorter reset."""
    manager = manager_for(PerConversation(1, keep_branch_points=2))
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c", branch_hints=(16, 24))
    assert [(b.request_id, b.branch_tokens) for b in branches(manager)] == [("t1", 16), ("t1", 24)]
    assert run_turn(manager, "t2", SYSTEM[:16] + tokens(2, 28), "c").num_reusable_tokens == 16
    assert run_turn(manager, "t3", SYSTEM + tokens(3, 20), "c").num_reusable_tokens == 24
    manager.check_integrity()


def test_a_turn_plans_no_more_branch_points_than_its_conversation_keeps():
    """Pools are sized for `keep_branch_points` windows per request: more hints (a client may
    send 8) would keep windows the pools have no room for and fail the request."""
    manager = manager_for(PerConversation(2, keep_branch_points=2))
    prompt = SYSTEM + tokens(1, 16)
    run_turn(manager, "t1", prompt, "c", finish=False, branch_hints=(8, 16, 24))
    assert manager.progress("t1").branch_tokens == (16, 24)
    manager.finish_request("t1")
    manager.check_integrity()


def test_hints_past_the_reused_prefix_or_near_the_prompt_end_plan_nothing():
    """A hint the windows already resume past, or one within replay + margin of the end (the
    checkpoint covers it), would only pin pages for nothing."""
    manager = manager_for(PerConversation(2, keep_branch_points=2))
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c")
    run_turn(
        manager,
        "t2",
        SYSTEM + tokens(1, 16) + tokens(2, 16),
        "c",
        finish=False,
        branch_hints=(8, 52),
    )
    assert manager.progress("t2").branch_tokens == ()
    manager.finish_request("t2")
    manager.check_integrity()


@pytest.mark.parametrize("hint", [0, -4, 41])
def test_a_hint_outside_the_prompt_is_refused_by_name(hint):
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    with pytest.raises(ValueError, match=r"branch_hints must lie in \[1, 40\]"):
        manager.add_request("t1", SYSTEM + tokens(1, 16), "c", branch_hints=(hint,))
    assert manager.request_ids() == ()


def test_a_hinted_turn_plans_its_hints_and_not_the_discovered_point():
    """t2 finds the system prompt's full blocks (f = 24) but names 8: a record at 24 too would
    push a hinted one out of the conversation's few."""
    manager = manager_for(PerConversation(2, keep_branch_points=2))
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c")
    run_turn(manager, "t2", SYSTEM + tokens(2, 20), "c", finish=False, branch_hints=(8,))
    assert manager.progress("t2").branch_tokens == (8,)
    manager.finish_request("t2")
    manager.check_integrity()


def test_releasing_branch_records_keeps_the_turns_and_leaves_the_pages_matchable():
    """Pressure's first take: the records' refs go to the LRU, the conversation keeps its turns,
    and the window stays matchable until evicted."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    run_turn(manager, "t1", SYSTEM + tokens(1, 16), "c", branch_hints=(24,))
    (branch,) = branches(manager)
    (release,) = manager.release_branch_records("c")
    assert set(release.evictable["win"]) == set(branch.pages["win"])
    assert branches(manager) == [] and [t.request_id for t in manager.retained_turns("c")] == ["t1"]
    assert manager.release_branch_records("c") == () == manager.release_branch_records("none")
    assert run_turn(manager, "t2", SYSTEM + tokens(2, 20), "c").num_reusable_tokens == 24
    manager.check_integrity()


def test_drop_conversation_frees_the_branch_records():
    """A branch record that outlives its conversation would leak its pages for good."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    reset_conversation(manager)
    plans = manager.drop_conversation("c")
    assert [plan.request_id for plan in plans] == ["t3", "t3", "t4"]
    assert all(pool.num_in_use == 0 for pool in manager.pools.values())
    manager.check_integrity()


def test_release_conversation_hands_the_branch_records_to_the_lru():
    """Under pressure the branch records must give their refs back with the turns."""
    manager = manager_for(PerConversation(2, keep_branch_points=1))
    reset_conversation(manager)
    (branch,) = branches(manager)
    releases = manager.release_conversation("c")
    assert [release.request_id for release in releases] == ["t3", "t3", "t4"]
    assert set(releases[0].evictable["win"]) == set(branch.pages["win"])
    assert all(pool.num_in_use == 0 for pool in manager.pools.values())
    manager.check_integrity()


def test_policy_counts_branch_records_among_retained_turns():
    """Sizing reads `retained_turns`; leaving branch records out would under-size the pools."""
    policy = make_reuse_policy(
        "per_conversation", max_num_turns=5, keep_root=True, keep_branch_points=1
    )
    assert (policy.retained_turns, policy.recent_turns, policy.keep_branch_points) == (7, 5, 1)
    assert PerConversation(5, keep_branch_points=True).retained_turns == 6
    with pytest.raises(ValueError, match="keep_branch_points must be >= 0, got -1"):
        PerConversation(2, keep_branch_points=-1)


def test_a_branch_record_replaced_under_its_key_gives_its_refs_back():
    """If this fails, a second record of the same branch point (a later turn hinting the same
    point, e.g. where the tools and system prompt end) overwrote the first without returning
    it: the first's refs stayed on pages no record holds, a leak that `check_integrity` finds
    after the run (seen on a rank with a disk tier and no host tier)."""
    turns = RetainedTurns()
    first = TurnRecord("c", "t1", {"win": (4, 5)}, 24)
    second = TurnRecord("c", "t2", {"win": (4, 5)}, 24)
    assert turns.add_branch(7, first, keep=2) == []
    assert turns.add_branch(7, second, keep=2) == [first]
    assert list(turns.branches.values()) == [second]
