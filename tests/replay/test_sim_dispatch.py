"""The fleet's host path per request: admission to the rank's queue takes time on a live fleet."""

from __future__ import annotations

import dataclasses

import pytest
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_dispatch import dispatch_seconds
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer
from sim_workloads import growing_conversation

OPTIONS = {"ranks": "1", "slots": "1", "block_size": "64", "gpu_pages": "10000"}


async def replay(conversations, dispatch_ms: float = 0.0, per_ktoken: float = 0.0, **fleet):
    config = load_sim_config(None, {**OPTIONS, **{k: str(v) for k, v in fleet.items()}})
    hardware = dataclasses.replace(
        config.hardware, dispatch_ms=dispatch_ms, dispatch_ms_per_ktoken=per_ktoken
    )
    target = SimTarget(dataclasses.replace(config, hardware=hardware))
    try:
        options = DriverOptions(sessions=1, time_scale=0.0, stagger_s=0.0)
        return await run_arm("sim", target, conversations, TokenSynthesizer(1, 32000), options, {})
    finally:
        await target.aclose()


def test_the_delay_is_a_fixed_part_and_one_per_thousand_prompt_tokens() -> None:
    """If this fails, a long prompt reaches its rank as fast as a short one, which the step
    logs of the H100 fleet contradict (34 ms at 16-32k tokens, 95 ms at 112-128k)."""
    hardware = dataclasses.replace(
        load_sim_config().hardware, dispatch_ms=36.0, dispatch_ms_per_ktoken=0.52
    )
    assert dispatch_seconds(hardware, 0) == pytest.approx(0.036)
    assert dispatch_seconds(hardware, 100_000) == pytest.approx(0.088)
    assert dispatch_seconds(load_sim_config().hardware, 100_000) == 0.0  # packaged: none


async def test_each_turn_reaches_its_rank_after_the_delay() -> None:
    """If this fails, an admitted request starts on its rank before the fleet's host path has
    brought it there (or is delayed twice): with one rank and one session, every turn's first
    token comes exactly its own delay later than with none."""
    conversation = growing_conversation("c", turns=3, first_blocks=20, step_blocks=4, block=64)
    base = await replay([conversation])
    delayed = await replay([conversation], dispatch_ms=50.0, per_ktoken=2.0)
    for before, after in zip(base.records, delayed.records, strict=True):
        delay = 0.050 + 2e-6 * after.prompt_tokens  # 2 ms per 1,000 tokens
        assert after.ttft_s == pytest.approx(before.ttft_s + delay)
