"""The simulated fleet: real admission and kvstore under a cost model, on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from kvfleet.services.replay.claude_code import read_claude_code
from kvfleet.services.replay.driver import DriverOptions, LoadDriver
from kvfleet.services.replay.readers import filter_max_model_len
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_target import SimTarget
from kvfleet.services.replay.target_types import TargetError
from kvfleet.services.replay.tokens import TokenSynthesizer
from replay_paths import CLAUDE_CODE
from sim_workloads import growing_conversation, replay_sim

BLOCK = 64


def claude_session(name: str = "trace_0002.json", max_len: int = 40000):
    return filter_max_model_len([read_claude_code(CLAUDE_CODE / name)], max_len)


async def test_same_seed_gives_identical_records() -> None:
    """If this fails, a sim run is not repeatable: event order or timing depends on chance."""
    conversations = claude_session()
    first, _ = await replay_sim(conversations, 1, ranks=2, slots=2)
    second, _ = await replay_sim(conversations, 1, ranks=2, slots=2)
    assert first.records == second.records
    assert len(first.records) > 5


async def test_one_rank_unbounded_pool_reaches_oracle() -> None:
    """If this fails, the sim loses reuse that an infinite cache with perfect routing keeps."""
    result, target = await replay_sim(claude_session(), 1, ranks=1, gpu_pages=100_000)
    measures = result.measures
    assert not result.errors
    assert measures.oracle_reuse > 0.8
    assert measures.prefix_reuse == pytest.approx(measures.oracle_reuse)
    assert target.stats()["preemptions"] == 0


async def test_ttft_is_virtual_and_grows_with_uncached_prompt() -> None:
    """If this fails, TTFT is not the cost model's prefill time on the virtual clock."""
    result, target = await replay_sim(
        claude_session(), 1, ranks=1, gpu_pages=100_000, chunk_tokens=100_000
    )
    first_turn = min(result.records, key=lambda r: r.arrival_s)
    later = [r for r in result.records if r.reused_tokens > 0]
    costs = target.fleet.costs
    expected = costs.prefill_seconds(first_turn.prompt_tokens)
    assert first_turn.ttft_s == pytest.approx(expected)
    best = max(later, key=lambda r: r.reused_tokens / r.prompt_tokens)
    assert best.ttft_s < costs.prefill_seconds(best.prompt_tokens) / 10


def crafted_saturation():
    """Three growing conversations on two one-slot ranks: returning turns find home busy."""
    return [growing_conversation(f"c{i}", turns=6, first_blocks=40, step_blocks=2, block=BLOCK)
            for i in range(3)]  # fmt: skip


async def test_strict_affinity_beats_lenient_under_saturation() -> None:
    """If this fails, strict affinity with bounded deferral no longer keeps turns on their
    prefix when ranks are saturated."""
    # migrate_kv off: a turn lenient sends away would pull its prefix and hide the difference.
    common = {"ranks": 2, "slots": 1, "gpu_pages": 4000, "max_wait_passes": 1000}
    common["migrate_kv"] = False
    strict, strict_target = await replay_sim(crafted_saturation(), 3, affinity="strict", **common)
    lenient, _ = await replay_sim(crafted_saturation(), 3, affinity="lenient", **common)
    assert strict.measures.prefix_reuse > lenient.measures.prefix_reuse
    assert strict.measures.prefix_reuse == pytest.approx(strict.measures.oracle_reuse)
    assert strict_target.stats()["deferrals"] > 0


async def test_memory_pressure_preempts_and_keeps_integrity() -> None:
    """If this fails, a rank short of pages deadlocks or corrupts its kvstore under load."""
    conversations = [
        growing_conversation(f"m{i}", turns=3, first_blocks=30, step_blocks=1, block=BLOCK)
        for i in range(4)
    ]
    result, target = await replay_sim(
        conversations, 4, ranks=1, slots=4, gpu_pages=80, chunk_tokens=512
    )
    assert not result.errors
    assert result.measures.requests == 12
    target.fleet.check_integrity()
    assert all(rank.idle for rank in target.fleet.ranks.values())


async def test_prompt_larger_than_pool_fails_cleanly() -> None:
    """If this fails, a request that cannot fit hangs the fleet instead of failing alone."""
    small = growing_conversation("s", turns=1, first_blocks=4, step_blocks=0, block=BLOCK)
    huge = growing_conversation("h", turns=1, first_blocks=50, step_blocks=0, block=BLOCK)
    result, target = await replay_sim([huge, small], 2, ranks=1, slots=2, gpu_pages=20)
    errors = {r.conversation_id: r.error for r in result.errors}
    assert list(errors) == ["h"]
    assert "does not fit" in errors["h"]
    assert result.measures.requests == 1
    target.fleet.check_integrity()


async def test_generate_failure_raises_target_error() -> None:
    """If this fails, a failed sim request is reported as success to the driver."""
    from kvfleet.services.replay.sim_config import load_sim_config
    from kvfleet.services.replay.sim_target import SimTarget

    target = SimTarget(load_sim_config(None, {"ranks": "1", "gpu_pages": "3"}))
    with pytest.raises(TargetError, match="does not fit"):
        await target.generate("c", list(range(1000)), 2)
    await target.aclose()


async def test_decode_runs_match_single_steps_exactly() -> None:
    """If this fails, batching decode steps into one event changes what the sim measures."""
    conversations = claude_session("trace_0010.json")
    runs, run_target = await replay_sim(conversations, 2, ranks=1, slots=2, gpu_pages=4000)
    single, single_target = await replay_sim(
        conversations, 2, ranks=1, slots=2, gpu_pages=4000, max_decode_run_steps=1
    )
    assert runs.records == single.records
    assert run_target.stats()["steps"] == single_target.stats()["steps"]
    assert run_target.stats()["events"] < single_target.stats()["events"] / 4


async def test_a_fault_inside_a_rank_ends_the_replay_with_its_error() -> None:
    """If this fails, one broken step leaves the whole replay waiting for ever (it hung, with
    no output, when a kvstore call raised inside a step event)."""
    target = SimTarget(load_sim_config(None, {"ranks": "1"}))
    (rank,) = target.fleet.ranks.values()
    finish = rank.manager.finish_request
    calls = []

    def finish_then_break(request_id: str) -> None:
        calls.append(request_id)
        if len(calls) == 3:
            raise ValueError("kvstore broke")
        finish(request_id)

    rank.manager.finish_request = finish_then_break
    driver = LoadDriver(
        target,
        TokenSynthesizer(1, 32000),
        DriverOptions(sessions=2, time_scale=0.0, stagger_s=0.0),
    )
    conversations = [growing_conversation(f"c{i}", 6, 4, 2, BLOCK) for i in range(2)]
    with pytest.raises(RuntimeError, match="simulated fleet failed") as raised:
        await asyncio.wait_for(driver.run(conversations), timeout=60)
    assert str(raised.value.__cause__) == "kvstore broke"
    target.clock.close()
