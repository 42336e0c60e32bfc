"""Simulated prefetch in the tool pause and conversations that move with their KV."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

from kvfleet.services.replay.sim_config import SimConfig, load_sim_config
from kvfleet.services.replay.sim_dispatch import admission_seconds
from kvfleet.services.replay.sim_target import SimTarget

BLOCK = 64
# per_request: finished prompts stay cached (LRU), so another prompt pushes them to host.
PRESSED = {
    "ranks": "1",
    "slots": "1",
    "gpu_pages": "60",
    "host_pages": "200",
    "reuse_policy": "per_request",
}


# The H100 fleet's admission figures (docs/sim-vs-live.md, twelfth look).
ADMIT_MS, ADMIT_MS_PER_HOST_PAGE = 30.0, 0.19


def _with_admission(config: SimConfig) -> SimConfig:
    hardware = dataclasses.replace(
        config.hardware, admit_ms=ADMIT_MS, admit_ms_per_host_page=ADMIT_MS_PER_HOST_PAGE
    )
    return dataclasses.replace(config, hardware=hardware)


async def _returning_turn_after_pressure(prefetch: str, admission: bool = False):
    """Turns a1, a2 (a 2 s gap), then conversation B, which pushes A to host, then a3
    2 s after a2: a3's request."""
    config = load_sim_config(None, {**PRESSED, "prefetch": prefetch})
    target = SimTarget(_with_admission(config) if admission else config)
    fleet, clock = target.fleet, target.clock
    a = list(range(40 * BLOCK))
    try:
        await fleet.generate("a", a, 1)
        await clock.sleep(2.0)
        ended = (await fleet.generate("a", a, 1)).token_times[-1]
        await fleet.generate("b", list(range(100_000, 100_000 + 40 * BLOCK)), 1)
        await clock.sleep(ended + 2.0 - clock.now())
        return await fleet.generate("a", a + list(range(50_000, 50_000 + BLOCK)), 1)
    finally:
        await target.aclose()


async def test_prefetch_brings_a_released_prefix_up_before_the_turn() -> None:
    """If this fails, a returning turn pays its host copy at admission although the tool pause
    (its own gaps: 2 s) left time to make it."""
    without = await _returning_turn_after_pressure("off")
    held = await _returning_turn_after_pressure("on")
    assert without.cached_tokens == held.cached_tokens == 40 * BLOCK
    assert without.host_pages_in > 1
    # The hold's prompt is a2's (40 blocks, of which a match leaves the last to compute):
    # a3, one block longer, onboards that one block.
    assert held.host_pages_in == 1


async def test_a_prefetched_turn_is_admitted_without_the_host_pages_stall() -> None:
    """If this fails, a turn whose prefix a prefetch brought up in the tool pause still pays the
    admission's per-host-page stall (0.19 ms a page on the H100 fleet) for those pages."""
    without = await _returning_turn_after_pressure("off", admission=True)
    held = await _returning_turn_after_pressure("on", admission=True)
    assert (without.host_pages_in, held.host_pages_in) == (without.host_pages_in, 1)
    spared_s = ADMIT_MS_PER_HOST_PAGE * (without.host_pages_in - 1) / 1e3
    ttft_without = without.token_times[0] - without.arrival_s
    assert held.token_times[0] - held.arrival_s <= ttft_without - 0.9 * spared_s


async def _decode_gaps(prefetch: bool) -> tuple[float, int]:
    """Conversation A pushed to host by B, then C decodes alone; 1 s in, A is prefetched:
    C's longest gap between tokens and the pages the prefetch brought up from host."""
    options = {**PRESSED, "slots": "2", "gpu_pages": "100"}
    target = SimTarget(_with_admission(load_sim_config(None, options)))
    fleet, clock = target.fleet, target.clock
    rank = fleet.ranks["rank-0"]
    a = list(range(40 * BLOCK))
    try:
        await fleet.generate("a", a, 1)
        await fleet.generate("b", list(range(100_000, 100_000 + 70 * BLOCK)), 1)
        decoding = asyncio.ensure_future(fleet.generate("c", list(range(200_000, 200_256)), 200))
        await clock.sleep(1.0)
        if prefetch:
            assert rank.prefetch("a", a, 60.0)
        times = (await decoding).token_times
        host_pages = rank.holds["a"].host_pages if prefetch else 0
    finally:
        await target.aclose()
    return max(later - earlier for earlier, later in itertools.pairwise(times)), host_pages


async def test_a_prefetch_holds_the_rank_while_it_onboards() -> None:
    """If this fails, a prefetch's host pages come up for free: the engine onboards them on its
    core thread between steps, as at a turn's admission, and the rank's decodes wait."""
    alone, _ = await _decode_gaps(prefetch=False)
    held, host_pages = await _decode_gaps(prefetch=True)
    assert host_pages > 10
    target = SimTarget(_with_admission(load_sim_config(None, PRESSED)))
    stall_s = admission_seconds(target.config.hardware, 1, host_pages)
    stall_s += host_pages * target.fleet.costs.host_copy_s_per_page
    await target.aclose()
    assert held >= alone + 0.99 * stall_s


async def _drained_turn(migrate: str):
    """Conversation A on rank-0, rank-0 drains, A's next turn: its request and the fleet."""
    options = {"ranks": "2", "slots": "1", "gpu_pages": "200", "host_pages": "200"}
    drain = {"drain_rank": "rank-0", "drain_at_s": "5", "migrate_kv": migrate}
    target = SimTarget(load_sim_config(None, {**options, **drain}))
    fleet, clock = target.fleet, target.clock
    a = list(range(40 * BLOCK))
    try:
        first = await fleet.generate("a", a, 1)
        assert first.rank_id == "rank-0"
        await clock.sleep(10.0)
        return await fleet.generate("a", a + list(range(50_000, 50_000 + BLOCK)), 1), fleet
    finally:
        await target.aclose()


async def test_a_drained_conversation_resumes_from_the_shared_disk() -> None:
    """If this fails, a conversation whose rank drained recomputes the prefix it had retained."""
    recomputed, _ = await _drained_turn("off")
    moved, fleet = await _drained_turn("on")
    assert recomputed.rank_id == moved.rank_id == "rank-1"
    assert recomputed.cached_tokens == 0
    assert moved.cached_tokens == 40 * BLOCK
    assert [(m.home, m.source) for m in fleet.moves.moved] == [("rank-0", "disk")]
    assert "rank-0" in fleet.moves.departed  # it left once idle; the pin moved to rank-1


async def test_a_turn_placed_away_pulls_its_prefix_from_the_live_home() -> None:
    """If this fails, a turn whose wait bound ran out recomputes what its home still holds."""
    options = {"ranks": "2", "slots": "1", "gpu_pages": "200", "host_pages": "200"}
    bound = {"max_wait_seconds": "0.2", "migrate_kv": "on"}
    target = SimTarget(load_sim_config(None, {**options, **bound}))
    fleet, clock = target.fleet, target.clock
    a = list(range(40 * BLOCK))

    def hog(name: str, start: int, tokens: int):  # a long decode holding a rank's only slot
        prompt = list(range(start, start + 4 * BLOCK))
        return asyncio.ensure_future(fleet.generate(name, prompt, tokens))

    try:
        first_hog = hog("c", 200_000, 2000)  # rank-0
        await clock.sleep(0.01)
        first = await fleet.generate("a", a, 1)  # rank-1, a's home
        second_hog = hog("d", 300_000, 4000)  # rank-1: a's next turn must wait for its home...
        await clock.sleep(0.01)
        moved = await fleet.generate("a", a + list(range(50_000, 50_000 + BLOCK)), 1)
        await asyncio.gather(first_hog, second_hog)
    finally:
        await target.aclose()
    # ... past its bound, and takes rank-0 when "c" ends there.
    assert (first.rank_id, moved.moved_from, moved.rank_id) == ("rank-1", "rank-1", "rank-0")
    assert moved.cached_tokens == 40 * BLOCK
    assert moved.pulled_bytes > 0


async def test_memory_pressure_gives_a_prefetch_back_before_a_pull() -> None:
    """If this fails, a turn already placed on a rank loses the prefix it waits for while a
    prefetch hold (a guess about a later turn) keeps its pages."""
    target = SimTarget(load_sim_config(None, {"ranks": "1", "slots": "1", "gpu_pages": "200"}))
    rank = target.fleet.ranks["rank-0"]
    try:
        assert rank.import_prefix("moved", list(range(8 * BLOCK)), 1e-12) > 0
        await target.fleet.generate("guess", list(range(9_000, 9_000 + 8 * BLOCK)), 1)
        assert rank.prefetch("guess", list(range(9_000, 9_000 + 8 * BLOCK)), 60.0)
        assert rank._cancel_holds_until(lambda: "guess" not in rank.holds)
        assert set(rank.holds) == {"moved"}
        assert not rank._cancel_holds_until(lambda: False)  # the pull goes last
        assert rank.holds == {}
    finally:
        await target.aclose()
