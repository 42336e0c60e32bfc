"""The simulator's disk tier is one volume for the fleet, as the operator mounts one: a rank
finds blocks another rank wrote there."""

from __future__ import annotations

from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget

BLOCK = 64
PROMPT = 40 * BLOCK


def tokens(start: int, count: int = PROMPT) -> list[int]:
    return list(range(start, start + count))


async def second_visit_reuse(disk_shared: str) -> int:
    """Conversation `a` on rank-0, pushed to disk there by `c`, then back on rank-1 (round
    robin); the tokens its return reused."""
    options = {"ranks": "2", "slots": "1", "gpu_pages": "60", "disk_pages": "400",
               "affinity": "none", "placement": "round_robin", "retained_conversations": "0",
               "disk_shared": disk_shared}  # fmt: skip
    target = SimTarget(load_sim_config(None, options))
    try:
        await target.generate("a", tokens(0), 2)  # rank-0
        await target.generate("b", tokens(100_000, BLOCK), 2)  # rank-1
        # rank-0: every page of its GPU, so all of a's blocks go to disk
        await target.generate("c", tokens(200_000, 58 * BLOCK), 2)
        again = await target.generate("a", tokens(0, PROMPT + BLOCK), 2)  # rank-1
    finally:
        await target.aclose()
    return again.cached_tokens


async def test_a_rank_reads_what_another_rank_wrote_to_the_shared_disk() -> None:
    """If this fails, each simulated rank has a disk of its own where an operator-run fleet has
    one volume: a turn placed on another rank (round robin, a lenient spill) recomputes what
    its first rank wrote to disk, and the simulator under-predicts such arms' reuse."""
    assert await second_visit_reuse("true") == PROMPT
    assert await second_visit_reuse("false") == 0
