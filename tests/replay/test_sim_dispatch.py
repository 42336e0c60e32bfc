"""The fleet's host path per request: admission to the rank's queue takes time on a live fleet."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from kvfleet.services.replay.driver import DriverOptions
from kvfleet.services.replay.model import Conversation, Turn
from kvfleet.services.replay.runner import run_arm
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_dispatch import admission_seconds, dispatch_seconds
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.tokens import TokenSynthesizer
from sim_workloads import growing_conversation

OPTIONS = {"ranks": "1", "slots": "1", "block_size": "64", "gpu_pages": "10000"}


async def replay(
    conversations,
    dispatch_ms: float = 0.0,
    per_ktoken: float = 0.0,
    admit_ms: float = 0.0,
    sessions: int = 1,
    stagger_s: float = 0.0,
    **fleet,
):
    config = load_sim_config(None, {**OPTIONS, **{k: str(v) for k, v in fleet.items()}})
    hardware = dataclasses.replace(
        config.hardware,
        dispatch_ms=dispatch_ms,
        dispatch_ms_per_ktoken=per_ktoken,
        admit_ms=admit_ms,
    )
    target = SimTarget(dataclasses.replace(config, hardware=hardware))
    try:
        options = DriverOptions(sessions=sessions, time_scale=0.0, stagger_s=stagger_s)
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


def one_turn(name: str, blocks: int, output_tokens: int) -> Conversation:
    turn = Turn(
        index=0,
        arrival_s=0.0,
        think_time_s=0.0,
        input_tokens=blocks * 64,
        output_tokens=output_tokens,
        hash_ids=tuple(range(1, blocks + 1)),
        namespace=name,
        block_size=64,
    )
    return Conversation(name, "crafted", (turn,))


def test_an_admission_costs_a_fixed_part_and_one_per_host_page() -> None:
    """If this fails, onboarding a long retained context from the host tier holds the engine
    no longer than a cold admission, which the H100 fleet's step logs contradict (a median 30
    ms with nothing onboarded, 0.19 ms more per host page)."""
    hardware = dataclasses.replace(
        load_sim_config().hardware, admit_ms=30.0, admit_ms_per_host_page=0.19
    )
    assert admission_seconds(hardware, 1, 0) == pytest.approx(0.030)
    assert admission_seconds(hardware, 2, 1000) == pytest.approx(0.250)
    assert admission_seconds(load_sim_config().hardware, 1, 1000) == 0.0  # packaged: none


async def test_an_admission_holds_the_sequences_already_decoding() -> None:
    """If this fails, the rank keeps decoding its running sequence while the engine admits a
    new request, where the engine's core thread runs no step then: with a request decoding
    when a second one is admitted, the decoding one's longest wait between two tokens grows
    by exactly the admission's time (as its own first token does)."""
    long_decode = one_turn("a", blocks=8, output_tokens=400)
    joining = one_turn("b", blocks=8, output_tokens=4)
    runs = {}
    for admit_ms in (0.0, 40.0):
        result = await replay(
            [long_decode, joining], admit_ms=admit_ms, sessions=2, stagger_s=0.1, slots="2"
        )
        runs[admit_ms] = {record.conversation_id: record for record in result.records}
    base, held = runs[0.0], runs[40.0]

    def longest_wait(record) -> float:
        times = record.token_times_s
        return max(b - a for a, b in itertools.pairwise(times))

    assert held["b"].arrival_s - held["a"].arrival_s == pytest.approx(0.1)
    assert held["a"].token_times_s[-1] > held["b"].first_token_s  # b joined a's decode
    assert held["a"].ttft_s == pytest.approx(base["a"].ttft_s + 0.040)  # its own admission
    # (b arrives at another point of a's decode steps: the mixed step's price moves by a
    # token's KV read, microseconds)
    assert longest_wait(held["a"]) == pytest.approx(longest_wait(base["a"]) + 0.040, abs=1e-5)
    assert longest_wait(base["a"]) < 0.040  # the wait is the admission's, not one step's


async def test_disk_writes_hold_the_core_thread_per_block_written() -> None:
    """If this fails, a rank's writes of evicted blocks to its disk tier cost it nothing, where
    the engine writes them on its core thread while it plans a step: with a disk tier and no
    host tier, conversations that push each other's blocks out make the rank busy for exactly
    the figure per block written longer, and the turns after the writes start later."""
    conversations = [one_turn(name, blocks=8, output_tokens=4) for name in "abcd"]
    small = {"gpu_pages": "20", "disk_pages": "1000", "retained_conversations": "0"}
    runs = {}
    for write_ms in (0.0, 25.0):
        config = load_sim_config(None, {**OPTIONS, **small})
        hardware = dataclasses.replace(config.hardware, disk_write_ms_per_page=write_ms)
        target = SimTarget(dataclasses.replace(config, hardware=hardware))
        try:
            options = DriverOptions(sessions=4, time_scale=0.0, stagger_s=0.0)
            result = await run_arm(
                "sim", target, conversations, TokenSynthesizer(1, 32000), options, {}
            )
            (rank,) = target.fleet.ranks.values()
            written = rank.manager.tiers.metrics["disk"].pages_in
            runs[write_ms] = (target.stats()["busy_s"], written, result.records)
        finally:
            await target.aclose()
    (base_busy, base_written, base_records), (busy, written, records) = runs[0.0], runs[25.0]
    assert written == base_written > 0
    assert busy - base_busy == pytest.approx(written * 0.025)
    assert records[-1].first_token_s > base_records[-1].first_token_s
