"""The engine over KV tiers: prefixes evicted from the device come back from host or shared disk.

A tiny device pool (23 usable pages per life cycle) is flooded by other conversations, so a
conversation's first turn leaves the device; its second turn must then be served from a lower
tier with the same greedy tokens as an engine that computes everything.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from engine_testkit import (
    final,
    greedy,
    run_call,
    shared_compute,
    tokens_of,
    turn_two,
    two_turns,
    wait_until,
)
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.tiers.metrics import DISK, HOST
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.kv.kv_setup import disk_tier_root
from kvfleet.services.engine.request.engine_request import GenerateCall

PAGE = 16
# per_request: finished prefixes stay cached (LRU) instead of retained, so floods evict them.
DEVICE_ONLY = EngineConfig(
    model="tiny",
    max_batch_size=2,
    max_num_batched_tokens=64,
    page_size=PAGE,
    kv_pages=24,
    reuse_policy="per_request",
    checkpoint_margin_tokens=32,
    disk_prefetch_num_reqs=2,
)
WITH_HOST = DEVICE_ONLY.with_changes(host_kv_pages=64)
FLOOD_CONVERSATIONS = 3
FLOOD_TOKENS = 320


def _flood(core: EngineCore, seed: int) -> None:
    """Other conversations that take every device page (and, with a small host tier, host's)."""
    rng = random.Random(seed)
    for i in range(FLOOD_CONVERSATIONS):
        prompt = tuple(rng.randrange(256) for _ in range(FLOOD_TOKENS))
        run_call(core, GenerateCall(f"flood-{seed}-{i}", prompt, greedy(4), f"flood-{seed}-{i}"))


def _core(config: EngineConfig, storage: str) -> EngineCore:
    """A started core with fresh tiers over a session model (`storage`: one per live core)."""
    return EngineCore(config, compute=shared_compute(config, storage)).start()


def _reference(call: GenerateCall) -> list[int]:
    """Greedy tokens of `call` computed from scratch (an empty, tier-less cache)."""
    core = _core(DEVICE_ONLY, "tiers-reference")
    try:
        outputs = run_call(core, call)
        assert final(outputs).usage.cached_tokens == 0
        return tokens_of(outputs)
    finally:
        core.stop()


def _check_clean(core: EngineCore) -> None:
    """Pools, tier indexes, unflushed copies, pins; the null page never written, KV finite."""
    core.check_integrity()
    core.call_on_core(core.compute.cache.check_integrity)


def _tier_metrics(core: EngineCore):
    return core.call_on_core(lambda: dict(core.manager.tiers.metrics))


def test_prefix_evicted_from_device_is_served_from_host():
    """Without offload/onboarding the returning turn would recompute (or read wrong pages)."""
    first, appended = two_turns(1, "c")
    core = _core(WITH_HOST, "tiers-host")
    try:
        turn_one = tokens_of(run_call(core, first))
        _flood(core, seed=11)
        second = turn_two(first, turn_one, appended)
        located = core.call_on_core(lambda: _locations(core, second))
        assert "device" not in located["full"][:9], located
        outputs = run_call(core, second)
        metrics = _tier_metrics(core)
        assert final(outputs).usage.cached_tokens >= 9 * PAGE
        assert metrics[HOST].hits >= 9
        assert tokens_of(outputs) == _reference(second)
        _check_clean(core)
    finally:
        core.stop()


def _locations(core: EngineCore, call: GenerateCall) -> dict[str, tuple[str, ...]]:
    """Where each block of `call`'s reusable prefix is now (a probe request, then dropped)."""
    manager, key = core.manager, "probe-locations"
    manager.add_request(key, call.prompt_token_ids)
    try:
        return dict(manager.match(key).locations)
    finally:
        manager.finish_request(key)


@pytest.fixture(scope="module")
def served_disk(tmp_path_factory):
    """A shared disk folder after pod A served turn 1 of a conversation and then a flood that
    pushed its blocks device -> host (8 pages) -> disk; with turn 2's call and its reference."""
    disk_dir = tmp_path_factory.mktemp("disk-tier")
    # all_reusable: window blocks are committed as computed, so they leave the device too
    # (under per_request the few endpoint windows rarely run out of device pages).
    config = DEVICE_ONLY.with_changes(
        reuse_policy="all_reusable",
        host_kv_pages=8,
        disk_tier_dir=str(disk_dir),
        disk_kv_pages=512,
    )
    second = _pod_a_serves_then_floods(config)
    return config, disk_dir, second, _reference(second)


def _pod_a_serves_then_floods(config: EngineConfig) -> GenerateCall:
    """Pod A serves turn 1, then a flood pushes its blocks down to disk; turn 2's call."""
    first, appended = two_turns(2, "c")
    core = _core(config, "tiers-pod-a")
    try:
        turn_one = tokens_of(run_call(core, first))
        _flood(core, seed=22)
        assert _tier_metrics(core)[DISK].pages_in > 0
        _check_clean(core)
    finally:
        core.stop()
    return turn_two(first, turn_one, appended)


def _pod_b(served_disk, tmp_path: Path) -> tuple[EngineConfig, Path]:
    """A copy of the served disk folder, and pod B's config using it (each test its own copy)."""
    config, disk_dir, _, _ = served_disk
    copy = tmp_path / "disk"
    shutil.copytree(disk_dir, copy)
    return config.with_changes(disk_tier_dir=str(copy)), copy


def test_second_pod_reuses_a_prefix_another_pod_left_on_the_shared_disk(served_disk, tmp_path):
    """Without the shared disk tier a pod's first turn of a moved conversation recomputes."""
    _, _, second, reference = served_disk
    config, _ = _pod_b(served_disk, tmp_path)
    core = _core(config, "tiers-pod-b")
    try:
        outputs = run_call(core, second)
        metrics = _tier_metrics(core)
        assert final(outputs).usage.cached_tokens >= 9 * PAGE
        # 9 `full` + 4 endpoint `window` blocks left the disk: read at admission, or prefetched
        # to host while the turn was queued (a race with the admission, so either counts).
        assert metrics[DISK].pages_out >= 13
        assert metrics[HOST].hits + metrics[DISK].hits == 13
        assert tokens_of(outputs) == reference
        _check_clean(core)
    finally:
        core.stop()


def test_a_pod_writing_behind_leaves_the_same_prefix_on_the_shared_disk(served_disk, tmp_path):
    """If this fails, blocks written by the disk writer thread are lost at the rank's stop or
    come back other than computed: pod A writes behind and stops; pod B reuses the prefix it
    left, with the greedy tokens of a run without any cache."""
    config, _, served_second, reference = served_disk
    disk_dir = tmp_path / "behind"
    behind = config.with_changes(disk_tier_dir=str(disk_dir), disk_write_behind=True)
    second = _pod_a_serves_then_floods(behind)
    assert second.prompt_token_ids == served_second.prompt_token_ids
    core = _core(config.with_changes(disk_tier_dir=str(disk_dir)), "tiers-pod-b")
    try:
        outputs = run_call(core, second)
        assert final(outputs).usage.cached_tokens >= 9 * PAGE
        assert tokens_of(outputs) == reference
        _check_clean(core)
    finally:
        core.stop()


def test_corrupt_disk_block_is_a_miss_and_output_stays_correct(served_disk, tmp_path):
    """Reading a damaged block file as KV would change the tokens the model generates."""
    _, _, second, reference = served_disk
    config, copy = _pod_b(served_disk, tmp_path)
    model = shared_compute(config, "tiers-pod-b").model_config
    root = Path(disk_tier_root(model, config.with_changes(disk_tier_dir=str(copy))))
    hashes = block_hashes(list(second.prompt_token_ids), PAGE)
    victim = root / "full" / f"{hashes[4]:016x}"[:2] / f"{hashes[4]:016x}.kvb"
    data = bytearray(victim.read_bytes())
    data[-7] ^= 0x40  # a payload byte: only the checksum can tell
    victim.write_bytes(bytes(data))
    core = _core(config, "tiers-pod-b")
    try:
        outputs = run_call(core, second)
        metrics = _tier_metrics(core)
        assert metrics[DISK].misses >= 1
        assert not victim.exists()
        assert final(outputs).usage.cached_tokens <= 4 * PAGE
        assert tokens_of(outputs) == reference
        _check_clean(core)
    finally:
        core.stop()


def test_queued_turns_disk_blocks_are_prefetched_to_host_before_admission(served_disk, tmp_path):
    """Without prefetch a queued turn would read every block from disk when it is admitted."""
    _, _, second, reference = served_disk
    config, _ = _pod_b(served_disk, tmp_path)
    config = config.with_changes(max_batch_size=1, host_kv_pages=64)
    core = _core(config, "tiers-pod-b-one-slot")
    try:
        blocker = GenerateCall("blocker", tuple(range(20)), greedy(300), "b")
        core.submit(blocker)
        handle = core.submit(second)
        wait_until(lambda: _tier_metrics(core)[HOST].pages_in >= 13)
        core.cancel("blocker")  # the slot frees; the queued turn is admitted next
        outputs = list(handle.outputs(30.0))
        metrics = _tier_metrics(core)
        # 9 `full` blocks and the endpoint window's 4 `window` blocks, all from host.
        assert (metrics[HOST].hits, metrics[DISK].hits) == (13, 0)
        assert tokens_of(outputs) == reference
        _check_clean(core)
    finally:
        core.stop()


def test_an_idle_rank_starts_a_queued_turns_reads_in_its_first_step(served_disk, tmp_path):
    """Reads chosen before the step's admissions go to the request admitted at once (it reads
    its blocks at admission anyway), and the turn queued behind it starts its reads a step
    late: on a rank that was idle, the whole burst but its head."""
    _, _, second, reference = served_disk
    config, _ = _pod_b(served_disk, tmp_path)
    config = config.with_changes(max_batch_size=1, host_kv_pages=64, disk_prefetch_num_reqs=1)
    # Not started: the test runs the first step itself, then hands the core to its thread.
    core = EngineCore(config, compute=shared_compute(config, "tiers-pod-b-first-step"))
    try:
        core.submit(GenerateCall("blocker", tuple(range(20)), greedy(300), "b"))
        handle = core.submit(second)
        core.run_once()  # the blocker takes the one slot; the turn waits
        assert [s.key for s in core.scheduler.waiting] == [f"{second.request_id}#0"]
        assert core.manager.tiers.wait_prefetch(30)
        # 9 `full` blocks and the endpoint window's 4 `window` blocks, read after one step.
        assert core.manager.land_prefetched() == 13
        core.start()
        core.cancel("blocker")
        outputs = list(handle.outputs(30.0))
        assert (_tier_metrics(core)[HOST].hits, _tier_metrics(core)[DISK].hits) == (13, 0)
        assert tokens_of(outputs) == reference
        _check_clean(core)
    finally:
        core.stop()


def test_the_step_log_counts_each_steps_disk_writes(tmp_path):
    """If this fails, the step log cannot tell a pause for disk writes from one for an
    onboarding (the per-page figures the simulator prices admissions with are read from these
    pauses): every page written to the disk tier is counted once, by the step it came before."""
    log = tmp_path / "steps.jsonl"
    config = DEVICE_ONLY.with_changes(
        host_kv_pages=8,
        disk_tier_dir=str(tmp_path / "disk"),
        disk_kv_pages=512,
        step_log_path=str(log),
    )
    core = _core(config, "tiers-step-log")
    try:
        first, _ = two_turns(2, "c")
        run_call(core, first)
        _flood(core, seed=23)
        written = _tier_metrics(core)[DISK].pages_in
    finally:
        core.stop()
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert written > 0
    assert sum(step["disk_out"] for step in steps) == written
    assert sum(step["disk_out"] > 0 for step in steps) >= 2  # spread over the steps they preceded


def test_tier_counters_are_exported_to_the_ranks_prometheus_registry():
    """The fleet's dashboards and autoscaler would see no tier traffic."""
    first, _ = two_turns(3, "c")
    core = _core(WITH_HOST, "tiers-host")
    try:
        run_call(core, first)
        _flood(core, seed=33)
        metrics = _tier_metrics(core)
        registry = core.metrics.registry
        for tier, counters in metrics.items():
            labels = {"tier": tier}
            assert (
                registry.get_sample_value("kvfleet_engine_kv_tier_hits_total", labels)
                == counters.hits
            )
            assert (
                registry.get_sample_value(
                    "kvfleet_engine_kv_tier_bytes_total", {**labels, "direction": "in"}
                )
                == counters.bytes_in
            )
            assert registry.get_sample_value(
                "kvfleet_engine_kv_tier_copy_seconds_total", labels
            ) == pytest.approx(counters.copy_seconds)
        assert metrics[HOST].bytes_in > 0
    finally:
        core.stop()
