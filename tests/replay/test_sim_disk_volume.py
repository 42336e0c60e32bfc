"""The simulator's disk tier is one volume for the fleet, as the operator mounts one: a rank
finds blocks another rank wrote there."""

from __future__ import annotations

import asyncio

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


async def test_a_block_gone_from_the_volume_is_recomputed_not_counted() -> None:
    """If this fails, a rank whose disk index still lists a block that another rank's index
    evicted from the shared volume admits the turn as if the match were there (the simulated
    fleet stops on a commit past the turn's pages), where the engine reuses what it really
    read and computes the rest."""
    options = {"ranks": "2", "slots": "1", "gpu_pages": "60", "disk_pages": "60",
               "affinity": "none", "placement": "round_robin",
               "retained_conversations": "0"}  # fmt: skip
    target = SimTarget(load_sim_config(None, options))
    big = 58 * BLOCK  # every page of a rank's GPU: what it held before goes to disk
    try:
        # a failed event of the simulated fleet leaves its callers waiting: fail, don't hang
        async with asyncio.timeout(20):
            await target.generate("a", tokens(0), 2)  # rank-0
            await target.generate("b", tokens(100_000, BLOCK), 2)  # rank-1
            await target.generate("c", tokens(200_000, big), 2)  # rank-0: a's blocks to disk
            back = await target.generate("a", tokens(0, PROMPT + BLOCK), 2)  # rank-1 reads them
            await target.generate("d", tokens(300_000, big), 2)  # rank-0: its index drops a's
            await target.generate("e", tokens(400_000, big), 2)  # rank-1: a leaves its GPU
            await target.generate("f", tokens(500_000, BLOCK), 2)  # rank-0
            listed = target.fleet.ranks["rank-1"].manager.tiers.disk.index.num_blocks("full")
            again = await target.generate("a", tokens(0, PROMPT + 2 * BLOCK), 2)  # rank-1
    finally:
        await target.aclose()
    assert back.cached_tokens == PROMPT
    assert listed >= PROMPT // BLOCK  # rank-1's index still lists a's prefix ...
    # ... part of which the volume lost: the turn reuses what was read and computes the rest
    assert again.cached_tokens < PROMPT
    assert target.fleet.ranks["rank-1"].manager.tiers.metrics["disk"].misses >= 1
