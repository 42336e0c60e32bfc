"""A moved turn's pulled prefix is held for its turn, and memory pressure takes it last.

A real manager (full attention, blocks of 4, 16 pages) holds two conversations' prefixes of
3 blocks: "x" by a router prefetch (60 s), "y" pulled for a moved turn (120 s).
"""

from __future__ import annotations

from kvfleet.kvstore.admission import MatchShrankError
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerRequest
from kvfleet.services.engine.core.prefetch_holds import PrefetchHolds

X = list(range(100, 112))
Y = list(range(200, 212))


def _holds() -> PrefetchHolds:
    config = KVStoreConfig(
        block_size=4,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": 16},
        reuse_policy=PerRequest(),
        checkpoint=False,
    )
    manager = KVCacheManager(config, clock=lambda: 0.0)
    manager.add_request("x-turn", X)  # x's last turn: its blocks stay cached
    manager.admit("x-turn", len(X))
    manager.commit("x-turn", len(X))
    manager.finish_request("x-turn")
    holds = PrefetchHolds(manager)
    assert holds.hold("x", X, 60).held
    manager.add_request("moved-y", Y)  # y's prefix, installed as computed elsewhere
    manager.admit_computed("moved-y")
    manager.commit("moved-y", len(Y))
    holds.keep("y", "moved-y", 120)
    return holds


def test_pressure_gives_up_a_prefetch_before_a_pulled_prefix():
    """Taking the longest-lasting hold first would throw away the pull a placed turn waits for."""
    holds = _holds()
    assert holds.cancel_until(lambda: "x" not in holds)
    assert "y" in holds
    holds.manager.check_integrity()


def test_the_moved_turn_takes_its_pulled_hold():
    """A hold the turn never took would keep its pages until it expires."""
    holds = _holds()
    assert holds.take("y")
    assert "y" not in holds
    assert "x" in holds
    assert len(holds.manager.request_ids()) == 1  # x's hold alone


def test_a_prefetch_whose_match_shrank_is_not_held_and_leaves_nothing(monkeypatch):
    """If this fails, a prefetch whose disk block turned out unreadable (the rest of its match
    no longer fits) raises out of the core's call, or leaves its kvstore request behind."""
    holds = _holds()
    manager = holds.manager

    def shrank(request_id, num_new_tokens):
        raise MatchShrankError(f"request {request_id!r}: its match shrank and no longer fits")

    holds.release("x")
    monkeypatch.setattr(manager, "admit", shrank)
    assert not holds.hold("x", X, 60).held
    assert "x" not in holds
    assert manager.request_ids() == ("moved-y",)
    manager.check_integrity()
