"""admissible_tokens: what `admit` would take after the reusable prefix, in one match."""

from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.policies import PerConversation


def test_it_counts_after_the_reused_prefix_and_agrees_with_can_admit():
    """If this fails, the simulator admits a waiting request `can_admit` would refuse (or
    waits on one it would take)."""
    manager = make_manager(pages=20, policy=PerConversation(max_num_turns=2))  # 19 usable
    prompt = tokens(0, 24)
    run_turn(manager, "t1", prompt, "c")  # 6 pages retained, 13 free
    manager.add_request("t2", prompt + tokens(1, 40), "c")
    assert manager.match("t2").num_reusable_tokens == 24
    assert manager.admissible_tokens("t2", 16) == 16
    assert manager.admissible_tokens("t2", 1000) == 40  # the rest of the prompt: 10 pages
    assert manager.can_admit("t2", 40)
    manager.add_request("big", tokens(2, 56))  # 14 pages, nothing reused
    assert not manager.can_admit("big", 56)
    assert manager.admissible_tokens("big", 1000) is None
    assert manager.admissible_tokens("big", 52) == 52


def test_an_admitted_request_admits_nothing_more():
    manager = make_manager(pages=16)
    manager.add_request("t1", tokens(0, 8))
    manager.admit("t1", 8)
    assert manager.admissible_tokens("t1", 8) is None
    manager.finish_request("t1")
