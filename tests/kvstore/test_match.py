"""Longest-prefix match across life cycles, through the manager."""

from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.life_cycles import (
    FullLifeCycle,
    PrivateLifeCycle,
    StateLifeCycle,
    WindowLifeCycle,
)
from kvfleet.kvstore.policies import AllReusable


def test_full_prefix_is_reused_up_to_the_first_difference():
    """A turn sharing 3 blocks with an earlier one must reuse exactly those 3 pages."""
    manager = make_manager()
    run_turn(manager, "a", tokens(1, 16))
    prompt = tokens(1, 12) + tokens(2, 8)
    manager.add_request("b", prompt)
    match = manager.match("b")
    assert (match.num_reusable_tokens, match.pages["full"]) == (12, (1, 2, 3))
    manager.finish_request("b")
    manager.check_integrity()


def test_one_token_is_always_left_to_compute():
    """A resent aligned prompt must recompute its last block, or no logits come out."""
    manager = make_manager()
    run_turn(manager, "a", tokens(1, 16))
    manager.add_request("b", tokens(1, 16))
    assert manager.match("b").num_reusable_tokens == 12
    manager.finish_request("b")
    manager.check_integrity()


def test_window_resumes_only_where_its_endpoint_window_is_cached():
    """Under per_request only the prompt-end window commits, so a shorter resume is impossible."""
    life_cycles = [FullLifeCycle("full"), WindowLifeCycle("win", window_tokens=8)]
    manager = make_manager(life_cycles, pages=32, checkpoint=False)
    run_turn(manager, "a", tokens(1, 32))
    manager.add_request("append", tokens(1, 32) + tokens(2, 4))
    manager.add_request("rewrite", tokens(1, 28) + tokens(3, 8))
    appended, rewritten = manager.match("append"), manager.match("rewrite")
    assert appended.num_reusable_tokens == 32
    assert appended.pages["win"] == (NULL_PAGE,) * 6 + (7, 8)
    assert rewritten.num_reusable_tokens == 0
    for request_id in ("append", "rewrite"):
        manager.finish_request(request_id)
    manager.check_integrity()


def test_all_reusable_window_resumes_anywhere_it_kept():
    """all_reusable commits every window block, so a rewritten tail still reuses the rest."""
    life_cycles = [FullLifeCycle("full"), WindowLifeCycle("win", window_tokens=8)]
    manager = make_manager(life_cycles, pages=32, policy=AllReusable())
    run_turn(manager, "a", tokens(1, 32))
    manager.add_request("rewrite", tokens(1, 28) + tokens(3, 8))
    assert manager.match("rewrite").num_reusable_tokens == 28
    manager.finish_request("rewrite")
    manager.check_integrity()


def test_replay_length_caps_reuse_before_the_prompt_end():
    """A window with replay R must resume at most R tokens before the end of the new prompt."""
    life_cycles = [FullLifeCycle("full"), WindowLifeCycle("win", 8, replay_tokens=8)]
    manager = make_manager(life_cycles, pages=32, policy=AllReusable())
    run_turn(manager, "a", tokens(1, 32))
    manager.add_request("b", tokens(1, 32) + tokens(2, 4))
    assert manager.match("b").num_reusable_tokens == 28
    manager.finish_request("b")
    manager.check_integrity()


def test_state_needs_a_snapshot_at_the_resume_position():
    """Without a state snapshot at a block boundary, a recurrent layer cannot resume there."""
    life_cycles = [FullLifeCycle("full"), StateLifeCycle("ssm", every_tokens=8)]
    manager = make_manager(life_cycles, pages=32)
    run_turn(manager, "a", tokens(1, 30))
    manager.add_request("b", tokens(1, 22) + tokens(2, 8))
    match = manager.match("b")
    assert match.num_reusable_tokens == 16
    assert match.pages["ssm"][:3] == (NULL_PAGE,) * 3 and match.pages["ssm"][3] != NULL_PAGE
    manager.finish_request("b")
    manager.check_integrity()


def test_private_and_optional_life_cycles_never_limit_reuse():
    """Scratch and optional layers must not shorten the reusable prefix."""
    life_cycles = [
        FullLifeCycle("full"),
        PrivateLifeCycle("scratch"),
        WindowLifeCycle("draft", window_tokens=4, required=False),
    ]
    manager = make_manager(life_cycles, pages=32, checkpoint=False)
    run_turn(manager, "a", tokens(1, 32))
    manager.add_request("b", tokens(1, 20) + tokens(2, 8))
    match = manager.match("b")
    assert match.num_reusable_tokens == 20
    assert match.pages["scratch"] == (NULL_PAGE,) * 5
    assert match.pages["draft"] == (NULL_PAGE,) * 5
    manager.finish_request("b")
    manager.check_integrity()
