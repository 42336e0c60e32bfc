"""Ranks that share one accelerator: processor sharing of the chip's time, on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from kvfleet.services.replay.sim_chip import SharedChip
from kvfleet.services.replay.sim_clock import VirtualClock
from kvfleet.services.replay.sim_sliced_chip import SlicedChip
from sim_workloads import growing_conversation, replay_sim


async def chip_ends(
    steps: list[tuple[float, float]] | list[tuple[float, float, float]],
    switch_s: float = 0.0,
    slice_s: float = 0.0,
) -> list[float]:
    """Start each (at_s, chip_seconds[, kernel_s]) step on one chip; when each one ends."""
    clock = VirtualClock()
    chip = SlicedChip(clock, slice_s, switch_s=switch_s) if slice_s else SharedChip(clock, switch_s)
    ends: list[float] = [0.0] * len(steps)
    finished = asyncio.Event()

    def start(index: int, seconds: float, kernel_s: float) -> None:
        def done() -> None:
            ends[index] = clock.now()
            if all(ends):
                finished.set()

        chip.run(seconds, done, kernel_s)

    for index, (at_s, seconds, *kernel) in enumerate(steps):
        clock.call_at(at_s, lambda i=index, s=seconds, k=kernel: start(i, s, k[0] if k else 0.0))
    await finished.wait()
    clock.close()
    return ends


async def test_a_step_alone_takes_its_chip_time() -> None:
    """If this fails, a lone rank on a shared chip runs slower or faster than on its own."""
    assert await chip_ends([(0.0, 0.25)]) == [pytest.approx(0.25)]


async def test_steps_in_flight_share_the_chip_equally() -> None:
    """If this fails, steps that overlap do not slow each other as time slicing does: a short
    decode step that arrives during a long prefill chunk ends at twice its own time, and the
    chunk ends late by exactly the decode's work."""
    ends = await chip_ends([(0.0, 1.0), (0.5, 0.1)])
    assert ends == [pytest.approx(1.1), pytest.approx(0.7)]
    two_alike = await chip_ends([(0.0, 0.3), (0.0, 0.3)])
    assert two_alike == [pytest.approx(0.6), pytest.approx(0.6)]


async def test_a_step_that_joins_a_busy_chip_pays_the_switch() -> None:
    """If this fails, the switch cost is charged to a step that had the chip alone, or not to
    one that joined another's: a decode of 0.1 s joining a 1 s chunk at 0.5 s does 0.15 s of
    chip work, so it ends at 0.8 and the chunk at 1.15; steps one after the other pay none."""
    ends = await chip_ends([(0.0, 1.0), (0.5, 0.1)], switch_s=0.05)
    assert ends == [pytest.approx(1.15), pytest.approx(0.8)]
    apart = await chip_ends([(0.0, 0.2), (0.5, 0.1)], switch_s=0.05)
    assert apart == [pytest.approx(0.2), pytest.approx(0.6)]


async def test_time_slices_run_one_step_at_a_time_and_do_not_cut_a_kernel() -> None:
    """If this fails, the time-sliced chip does not run steps in turn as the GPU's scheduler
    does: with 0.2 s slices a 0.1 s decode arriving at 0.5 s in a 1 s chunk waits for the
    chunk's slice to end (0.6), then runs alone at full speed (0.7), and the chunk ends late by
    exactly its work (1.1); with 0.35 s kernels the slice ends at the kernel's end (0.7), so
    the decode ends at 0.8; two steps that arrive together take turns (0.3 s each, 0.1 s slices:
    0.5 and 0.6), and each hand-over costs the step that gets the chip the switch."""
    assert await chip_ends([(0.0, 1.0), (0.5, 0.1)], slice_s=0.2) == [
        pytest.approx(1.1),
        pytest.approx(0.7),
    ]
    assert await chip_ends([(0.0, 1.0, 0.35), (0.5, 0.1)], slice_s=0.2) == [
        pytest.approx(1.1),
        pytest.approx(0.8),
    ]
    assert await chip_ends([(0.0, 0.3), (0.0, 0.3)], slice_s=0.1) == [
        pytest.approx(0.5),
        pytest.approx(0.6),
    ]
    # hand-overs at 0.6 (to the decode) and 0.7 (back to the chunk): 0.05 each
    switched = await chip_ends([(0.0, 1.0), (0.5, 0.1)], switch_s=0.05, slice_s=0.2)
    assert switched == [pytest.approx(1.2), pytest.approx(0.75)]


async def test_ranks_on_one_chip_take_longer_and_keep_their_reuse() -> None:
    """If this fails, `ranks_per_chip` does not couple the ranks' time, or it changes what the
    kvstore keeps (only time may move)."""
    conversations = [
        growing_conversation(f"c{i}", turns=4, first_blocks=30, step_blocks=2, block=64)
        for i in range(4)
    ]
    options = {"ranks": 2, "slots": 2, "block_size": 64, "gpu_pages": 100_000}
    apart, _ = await replay_sim(conversations, 4, **options)
    shared, target = await replay_sim(conversations, 4, ranks_per_chip=2, **options)
    assert len(target.fleet.chips) == 1
    assert target.fleet.chips[0].switch_s == 0.0  # the packaged figures: no switch cost
    assert shared.measures.prefix_reuse == pytest.approx(apart.measures.prefix_reuse)
    first_token = lambda result: sorted(r.ttft_s for r in result.records)  # noqa: E731
    assert sum(first_token(shared)) > 1.5 * sum(first_token(apart))
