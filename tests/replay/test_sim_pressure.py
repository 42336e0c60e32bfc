"""Retained turns under memory pressure and the pool split that accounts for them."""

from __future__ import annotations

from pathlib import Path

from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_fleet import SimFleet
from kvfleet.services.replay.sim_target import SimTarget

BLOCK = 64
HYBRID = Path(__file__).resolve().parents[2] / "bench" / "sim_hybrid.yaml"


async def test_pressure_releases_retained_turns_to_lru_and_host() -> None:
    """If this fails, a rank short of pages throws away a retained conversation's prefix
    (drop) instead of leaving it matchable and offloading it to the host tier."""
    options = {"ranks": "1", "slots": "1", "gpu_pages": "60", "host_pages": "200"}
    target = SimTarget(load_sim_config(None, {**options, "max_num_turns": "2"}))
    first = list(range(40 * BLOCK))
    other = list(range(100_000, 100_000 + 40 * BLOCK))
    try:
        await target.generate("a", first, 2)
        await target.generate("b", other, 2)  # needs A's retained pages
        again = await target.generate("a", first + list(range(50_000, 50_000 + BLOCK)), 2)
    finally:
        await target.aclose()
    assert again.cached_tokens == 40 * BLOCK
    assert target.stats()["released_conversations"] == 2  # A for B, then B for A's return


def pool_pages(**overrides: str) -> dict[str, int]:
    fleet = {"gpu_pages": "3000", "slots": "2", "retained_conversations": "3", **overrides}
    rank = next(iter(SimFleet(load_sim_config(HYBRID, fleet)).ranks.values()))
    return {name: pool.num_usable + 1 for name, pool in rank.manager.pools.items()}


def test_retained_turns_get_window_pages_at_the_same_budget() -> None:
    """If this fails, max_num_turns: 5 runs on pools sized for no retained turns, so keeping
    turns evicts the endpoints of live ones."""
    # An H200's pages: above the lone-conversation floor, where the proportional split decides.
    per_request = pool_pages(reuse_policy="per_request", gpu_pages="12800")
    five_turns = pool_pages(reuse_policy="per_conversation", max_num_turns="5", gpu_pages="12800")
    assert sum(per_request.values()) == sum(five_turns.values()) == 12800
    assert five_turns["swa"] > 1.5 * per_request["swa"]


def test_no_retained_conversations_sizes_like_per_request() -> None:
    """If this fails, `retained_conversations: 0` no longer turns retained-turn sizing off
    (residents' branch windows are not retained turns: they go with keep_branch_points)."""
    off = pool_pages(
        reuse_policy="per_conversation", retained_conversations="0", keep_branch_points="0"
    )
    assert off == pool_pages(reuse_policy="per_request")
