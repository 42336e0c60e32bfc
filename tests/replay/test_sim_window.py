"""A measured window: the driver sends no turn once `stop_s` has passed since the start."""

from __future__ import annotations

import dataclasses

import pytest
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer
from sim_workloads import growing_conversation


async def test_no_turn_is_sent_after_the_window() -> None:
    """If this fails, a window-bounded replay keeps sending turns (and simulating them) after
    the window it measures, or stops before it."""
    conversation = growing_conversation("c", turns=6, first_blocks=4, step_blocks=1, block=64)
    paced = tuple(dataclasses.replace(turn, think_time_s=10.0) for turn in conversation.steps)
    conversations = [dataclasses.replace(conversation, steps=paced)]
    target = SimTarget(load_sim_config(None, {"ranks": "1"}))
    options = DriverOptions(sessions=1, time_scale=1.0, stagger_s=0.0, stop_s=25.0)
    try:
        result = await run_arm("w", target, conversations, TokenSynthesizer(1, 32000), options, {})
    finally:
        await target.aclose()
    arrivals = sorted(r.arrival_s for r in result.records)
    assert len(arrivals) == 2  # ~10 and ~20 s (each turn thinks 10 s first); the next ~30 s
    assert arrivals[-1] < 25.0


def test_stop_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stop_s=0"):
        DriverOptions(stop_s=0)
