"""One conversation alone on one idle rank reuses its prefix whenever the pages can hold it."""

from __future__ import annotations

from pathlib import Path

from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.model import Conversation, Turn
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer

BLOCK = 64
HYBRID = Path(__file__).resolve().parents[2] / "bench" / "sim_hybrid.yaml"
# sim_bench's memory-pressed rank: 3000 pages for 2 slots and 3 conversations of 5 turns.
# NOTE: these crafted turns carry no branch hints, and the pages are chosen at the edge of the
# lone floor without branch windows, so the branch records' sizing is off.
PRESSED = {
    "ranks": "1",
    "slots": "2",
    "gpu_pages": "3000",
    "retained_conversations": "3",
    "keep_branch_points": "0",
}


def rewritten_session(first: int, second: int, kept: int, later: int, step: int) -> Conversation:
    """Claude Code's shape: the second turn keeps only the first `kept` blocks of the first
    (tools and system prompt) and rewrites the rest; every later turn extends the one before."""
    blocks = [list(range(1, first + 1)), list(range(1, kept + 1))]
    blocks[1] += list(range(10_000, 10_000 + second - kept))
    for _ in range(later):
        blocks.append(
            blocks[-1]
            + list(range(20_000 + len(blocks) * step, 20_000 + len(blocks) * step + step))
        )
    turns = tuple(
        Turn(index, 0.0, 0.0, len(ids) * BLOCK, 4, tuple(ids), "lone", BLOCK)
        for index, ids in enumerate(blocks)
    )
    return Conversation("lone", "crafted", turns)


async def test_rewritten_turn_does_not_cost_the_rest_of_the_session() -> None:
    """If this fails, the rank gave up the session's prefix after one rewritten turn: either
    the pool split left the full pool no room for the rewritten prompt next to the retained
    one (the conversation is released), or a released prefix was evicted from its head, the
    blocks every later turn needs first."""
    # 1250 + 1300 full pages fit next to the window pool's lone-request floor, not in the
    # proportional split's 2424.
    session = rewritten_session(first=1250, second=1300, kept=200, later=4, step=40)
    target = SimTarget(load_sim_config(HYBRID, {**PRESSED, "max_num_turns": "5"}))
    try:
        result = await run_arm(
            "lone",
            target,
            [session],
            TokenSynthesizer(1, 32000),
            DriverOptions(sessions=1, time_scale=0.0, stagger_s=0.0),
            {},
        )
    finally:
        await target.aclose()
    by_turn = {r.turn_index: r for r in result.records}
    assert not result.errors
    assert by_turn[1].reused_tokens == 0  # the window cannot resume inside a rewrite
    for index in range(2, 6):
        previous = by_turn[index - 1].prompt_tokens
        assert by_turn[index].reused_tokens >= previous - 1024, index
    assert target.stats()["released_conversations"] == 0
