"""Small crafted workloads and a one-call sim replay for the simulator's tests."""

from __future__ import annotations

from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.model import Conversation, Turn
from kvfleet.services.replay.runner import ArmResult, run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer


def growing_conversation(name: str, turns: int, first_blocks: int, step_blocks: int, block: int):
    """A conversation whose every turn resends the previous prompt plus `step_blocks` blocks."""
    steps = []
    for index in range(turns):
        blocks = first_blocks + index * step_blocks
        steps.append(
            Turn(
                index=index,
                arrival_s=0.0,
                think_time_s=0.0,
                input_tokens=blocks * block,
                output_tokens=4,
                hash_ids=tuple(range(1, blocks + 1)),
                namespace=name,
                block_size=block,
            )
        )
    return Conversation(name, "crafted", tuple(steps))


async def replay_sim(
    conversations, sessions: int, seed: int = 1, **overrides: object
) -> tuple[ArmResult, SimTarget]:
    """Replay on a fresh simulated fleet (no think time); aclose checks its integrity."""
    target = SimTarget(load_sim_config(None, {k: str(v) for k, v in overrides.items()}))
    try:
        result = await run_arm(
            "sim",
            target,
            conversations,
            TokenSynthesizer(seed, 32000),
            DriverOptions(sessions=sessions, time_scale=0.0, stagger_s=0.0),
            {},
        )
    finally:
        await target.aclose()
    return result, target
