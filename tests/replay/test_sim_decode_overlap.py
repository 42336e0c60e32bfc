"""Overlapped decode: the engine plans and launches a decode step while the one before runs on
the device, so a steady decode's step costs the longer of its host work and its chip time."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from kvfleet.services.core.cost_model import CostModel
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.model import Conversation, Turn
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer

BLOCK = 64
PROMPT_BLOCKS = 1500  # a 96k-token context: its decode's KV read is a few ms of chip time
OUTPUT = 40


def one_turn(name: str, blocks: int = PROMPT_BLOCKS, output_tokens: int = OUTPUT) -> Conversation:
    turn = Turn(
        index=0,
        arrival_s=0.0,
        think_time_s=0.0,
        input_tokens=blocks * BLOCK,
        output_tokens=output_tokens,
        hash_ids=tuple(range(1, blocks + 1)),
        namespace=name,
        block_size=BLOCK,
    )
    return Conversation(name, "crafted", (turn,))


async def token_times(
    conversations: list[Conversation],
    overhead_ms: float,
    overlap: bool,
    ranks_per_chip: int,
    slots: int = 2,
    gpu_pages: int = 10000,
) -> tuple[dict[str, list[float]], CostModel]:
    """Each request's token times (by conversation) on one rank (2 slots), and the costs."""
    options = {
        "ranks": "1",
        "slots": str(slots),
        "block_size": str(BLOCK),
        "gpu_pages": str(gpu_pages),
    }
    config = load_sim_config(None, {**options, "ranks_per_chip": str(ranks_per_chip)})
    hardware = dataclasses.replace(
        config.hardware, step_overhead_ms=overhead_ms, decode_overlap=overlap
    )
    target = SimTarget(dataclasses.replace(config, hardware=hardware))
    try:
        sessions = len(conversations)
        options_ = DriverOptions(sessions=sessions, time_scale=0.0, stagger_s=0.0)
        result = await run_arm(
            "sim", target, conversations, TokenSynthesizer(1, 32000), options_, {}
        )
    finally:
        await target.aclose()
    costs = CostModel.from_figures(config.model, hardware, BLOCK)
    return {r.conversation_id: list(r.token_times_s) for r in result.records}, costs


def chip_s(costs: CostModel, contexts: tuple[int, ...]) -> float:
    """A decode step's chip time: its price less the host overhead."""
    return costs.decode_seconds(contexts) - costs.step_overhead_s


@pytest.mark.parametrize("ranks_per_chip", [1, 2])
@pytest.mark.parametrize("overhead_ms", [20.0, 0.2])
async def test_a_steady_decode_costs_the_longer_of_host_and_chip(
    ranks_per_chip: int, overhead_ms: float
) -> None:
    """If this fails, a decode step that the engine plans while the step before runs pays its
    host work after that step's chip time, where the engine's overlapped decode runs them at
    once: one long sequence decoding alone takes max(overhead, chip) a token, not their sum
    (the H100 fleet's solo two-sequence decodes: 4.1-4.2 ms a cycle while the model's chip time
    goes 2.3-3.6 ms, priced 6.3-7.6 ms as a sum), on a rank alone (decode runs) or on a
    shared chip (single steps); with the rule off, the sum."""
    context = PROMPT_BLOCKS * BLOCK
    for overlap in (True, False):
        times, costs = await token_times([one_turn("c")], overhead_ms, overlap, ranks_per_chip)
        steady = [b - a for a, b in itertools.pairwise(times["c"])][
            2:
        ]  # the first decodes follow the prefill: no overlap
        assert len(steady) == OUTPUT - 3
        host = costs.step_overhead_s
        for offset, gap in enumerate(steady):
            now = chip_s(costs, (context + 2 + offset,))
            before = chip_s(costs, (context + 1 + offset,))
            want = max(host - before, 0.0) + now if overlap else host + now
            assert gap == pytest.approx(want, rel=1e-9, abs=1e-12)
        chip = chip_s(costs, (context,))
        if overhead_ms > 1.0:  # host-bound: the chip time hides under the host work
            assert overlap or steady[0] > host + 0.5 * chip
            assert not overlap or steady[0] == pytest.approx(host, rel=1e-3)
        else:  # chip-bound: the host work hides under the chip time
            assert not overlap or steady[0] == pytest.approx(chip, rel=1e-4)


async def test_a_step_after_a_request_ends_pays_its_host_work() -> None:
    """If this fails, the engine is taken to look ahead where it does not: after a step in
    which a request produced its last token the next plan differs (the request leaves), so the
    engine reads the tokens first and the next step's host work comes after the chip time."""
    short, long_ = one_turn("s", output_tokens=30), one_turn("l", output_tokens=60)
    by_request, costs = await token_times([short, long_], 20.0, True, 2)
    end = by_request["s"][-1]
    times = by_request["l"]
    after = next(i for i, t in enumerate(times) if t > end)
    host = costs.step_overhead_s
    context = PROMPT_BLOCKS * BLOCK
    # the step right after the short request's last token: its full host work, then its chip
    gap = times[after] - times[after - 1]
    assert gap == pytest.approx(host + chip_s(costs, (context + after - 1,)), rel=1e-9)
    # the one after that overlaps again
    assert times[after + 1] - times[after] == pytest.approx(host, rel=1e-3)


@pytest.mark.parametrize(
    "spare_pages",
    [10, 100],  # w's first chunk does not fit: it waits; it fits: w runs, its prefill stalls
    ids=["waiting", "prefill-stalled"],
)
async def test_a_request_short_of_pages_leaves_the_decode_overlapped(spare_pages: int) -> None:
    """If this fails, the simulator takes the engine to read every step's tokens while a
    request short of pages is at the rank: the engine plans ahead then too (lookahead.py), so
    two sequences decoding with a third sent to the rank still pay only what of their host
    work outlasts the step before's chip time."""
    long_, short = one_turn("l", output_tokens=60), one_turn("s", output_tokens=30)
    queued = one_turn("w", output_tokens=10)
    # three slots, pages for two prompts: w waits at the rank for s's pages
    pages = 2 * PROMPT_BLOCKS + spare_pages
    by_request, costs = await token_times(
        [long_, short, queued], 20.0, True, 1, slots=3, gpu_pages=pages
    )
    short_end = by_request["s"][-1]
    assert by_request["w"][0] > short_end  # w waited for s's pages all along
    # both decoding: from s's first token (its prefill's chunks ran beside l's decodes) to its end
    times = [t for t in by_request["l"] if by_request["s"][0] <= t <= short_end]
    steady = [b - a for a, b in itertools.pairwise(times)][2:]
    assert len(steady) > 20
    host = costs.step_overhead_s
    assert all(gap == pytest.approx(host, rel=1e-3) for gap in steady)
