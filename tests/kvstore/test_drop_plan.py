"""Drop plans: what a turn gives up when its conversation moves on."""

from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.drop_plan import build_drop_plan
from kvfleet.kvstore.life_cycles import FullLifeCycle, PrivateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.results import TurnRecord

LIFE_CYCLES = {
    "win": WindowLifeCycle("win", window_tokens=8),
    "draft": WindowLifeCycle("draft", window_tokens=8, required=False),
    "scratch": PrivateLifeCycle("scratch"),
}


def only_this_turn(name, page):
    return 1


def test_missing_optional_page_still_drops_the_required_pages():
    """An optional life cycle's missing page must not keep a required window pinned forever."""
    turn = TurnRecord("c", "r1", {"win": (5, 6), "draft": (None, 3), "scratch": (None,)})
    plan = build_drop_plan(turn, LIFE_CYCLES, only_this_turn)
    assert plan.dropped == {"win": (5, 6), "draft": (3,)}
    assert "scratch" not in plan.released


def test_missing_required_page_means_no_plan():
    """A turn that cannot be resumed has no endpoint to give up page by page."""
    turn = TurnRecord("c", "r1", {"win": (5, None), "draft": (3, 4)})
    assert build_drop_plan(turn, LIFE_CYCLES, only_this_turn) is None


def test_page_held_elsewhere_is_released_not_dropped():
    """A page a live request still holds must never be freed under it."""
    turn = TurnRecord("c", "r1", {"win": (5, 6)})
    plan = build_drop_plan(turn, LIFE_CYCLES, lambda name, page: 2 if page == 6 else 1)
    assert plan.released == {"win": (5, 6)}
    assert plan.dropped == {"win": (5,)}


def test_manager_drops_required_window_beside_a_starved_optional_one():
    """Through the manager: optional pages missing (pool held by another request), the
    required window endpoint of the older turn is still freed; private scratch never blocks."""
    life_cycles = [FullLifeCycle("full"), *LIFE_CYCLES.values()]
    pages = {"full": 64, "win": 32, "draft": 2, "scratch": 64}
    manager = make_manager(life_cycles, pages, policy=PerConversation(max_num_turns=1))
    manager.add_request("hog", tokens(9, 4))
    manager.admit("hog", 4)
    run_turn(manager, "t1", tokens(1, 24), "c")
    (t1,) = manager.retained_turns("c")
    assert t1.pages["draft"] == (None, None) and "scratch" not in t1.pages
    plans = run_turn_plans(manager, "t2", tokens(1, 24) + tokens(2, 16), "c")
    assert [plan.request_id for plan in plans] == ["t1"]
    assert plans[0].dropped["win"] == t1.pages["win"]
    assert all(manager.pools["win"].ref_count(page) == 0 for page in t1.pages["win"])
    assert all(manager.pools["win"].page_hash(page) is None for page in t1.pages["win"])
    manager.finish_request("hog")
    manager.check_integrity()


def run_turn_plans(manager, request_id, prompt, conversation_id):
    """Prefill a turn in one chunk; return the drop plans its context end applied."""
    manager.add_request(request_id, prompt, conversation_id)
    match = manager.match(request_id)
    manager.admit(request_id, len(prompt) - match.num_reusable_tokens)
    manager.commit(request_id, len(prompt))
    plans = manager.finish_context(request_id)
    manager.finish_request(request_id)
    return plans
