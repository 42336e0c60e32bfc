"""Scale-in drain: a draining rank's retained prefixes reach another rank through the shared disk.

Rank A serves turn 1 of a conversation (150 tokens, pages of 16) under per_conversation. It
retains what a resume at the prompt end (9 blocks) and at the checkpoint (7 blocks) needs: full
blocks 0..8 and window blocks 3..8 (the tiny model's window is 4 blocks): 15 blocks. Rank B
shares A's disk folder, has no host tier and a fresh cache; it serves turn 2 of the same
conversation, which must resume at turn 1's prompt end (9 blocks, 144 tokens) from disk.
"""

from __future__ import annotations

import pytest
from engine_testkit import (
    TEST_CONFIG,
    final,
    run_call,
    shared_compute,
    tokens_of,
    turn_two,
    two_turns,
)
from kvfleet.kvstore.tiers.metrics import DISK
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.engine.rank.podinfo import DRAINING_ANNOTATION
from kvfleet.services.engine.request.engine_request import GenerateCall

PAGE = TEST_CONFIG.page_size
RETAINED_BLOCKS = 9 + 6  # full 0..8, window 3..8 (endpoint 5..8, checkpoint 3..6)
RESUMED_TOKENS = 9 * PAGE
FLUSHED_METRIC = "kvfleet_engine_drain_flushed_blocks_total"


@pytest.fixture(scope="module")
def shared_disk_config(tmp_path_factory) -> EngineConfig:
    """Every rank of this module shares one disk folder (tests use distinct conversations)."""
    disk_dir = tmp_path_factory.mktemp("drain-disk")
    return TEST_CONFIG.with_changes(disk_tier_dir=str(disk_dir), disk_kv_pages=256)


def _core(config: EngineConfig, storage: str) -> EngineCore:
    """A started core with a fresh cache over a session model (`storage`: one per live core)."""
    return EngineCore(config, compute=shared_compute(config, storage)).start()


def _flushed(core: EngineCore) -> float:
    return core.metrics.registry.get_sample_value(FLUSHED_METRIC)


def _check_clean(core: EngineCore) -> None:
    """Pools, tier indexes, unflushed copies, pins; the null page never written, KV finite."""
    core.check_integrity()
    core.call_on_core(core.compute.cache.check_integrity)


def _reference(call: GenerateCall) -> list[int]:
    """Greedy tokens of `call` computed from scratch (an empty, tier-less cache)."""
    core = _core(TEST_CONFIG, "drain-reference")
    try:
        outputs = run_call(core, call)
        assert final(outputs).usage.cached_tokens == 0
        return tokens_of(outputs)
    finally:
        core.stop()


def _serve_on_b(config: EngineConfig, call: GenerateCall) -> tuple[int, int, list[int]]:
    """Rank B serves `call` with a fresh cache: cached tokens, disk hits, greedy tokens."""
    core = _core(config, "drain-b")
    try:
        outputs = run_call(core, call)
        disk_hits = core.call_on_core(lambda: core.manager.tiers.metrics[DISK].hits)
        _check_clean(core)
        return final(outputs).usage.cached_tokens, disk_hits, tokens_of(outputs)
    finally:
        core.stop()


def test_turning_draining_flushes_retained_turns_for_another_rank(shared_disk_config):
    """Without the drain flush the conversation's next turn on rank B would recompute it all."""
    first, appended = two_turns(1, "d")
    core = _core(shared_disk_config, "drain-a")
    try:
        second = turn_two(first, tokens_of(run_call(core, first)), appended)
        assert _flushed(core) == 0
        core.set_draining(True)
        core.call_on_core(lambda: None)  # commands run in order: the flush has run
        assert _flushed(core) == RETAINED_BLOCKS
        assert core.call_on_core(lambda: core.manager.num_retained_off_disk()) == 0
        _check_clean(core)
    finally:
        core.stop()
    cached, disk_hits, output = _serve_on_b(shared_disk_config, second)
    assert (cached, disk_hits) == (RESUMED_TOKENS, 9 + 4)  # full 0..8, endpoint window 5..8
    assert output == _reference(second)


def test_a_turn_retained_while_draining_is_flushed_at_its_context_end(shared_disk_config):
    """A pinned turn that finishes on a draining rank would otherwise leave only on its device."""
    first, appended = two_turns(2, "d")
    core = _core(shared_disk_config, "drain-a")
    try:
        core.set_draining(True)
        second = turn_two(first, tokens_of(run_call(core, first)), appended)
        assert _flushed(core) == RETAINED_BLOCKS
        _check_clean(core)
    finally:
        core.stop()
    cached, disk_hits, output = _serve_on_b(shared_disk_config, second)
    assert (cached, disk_hits) == (RESUMED_TOKENS, 9 + 4)
    assert output == _reference(second)


def test_a_rank_that_is_not_draining_writes_nothing_to_disk(shared_disk_config):
    """The control: a serving rank keeps retained turns on its device (no host, no offload)."""
    first, appended = two_turns(3, "d")
    core = _core(shared_disk_config, "drain-a")
    try:
        second = turn_two(first, tokens_of(run_call(core, first)), appended)
        core.set_draining(False)
        core.call_on_core(lambda: None)
        assert _flushed(core) == 0
    finally:
        core.stop()
    cached, disk_hits, _ = _serve_on_b(shared_disk_config, second)
    assert (cached, disk_hits) == (0, 0)


def test_the_rank_hands_the_pods_drain_mark_to_its_core(shared_disk_config, tmp_path):
    """Without it the heartbeat would report draining while the core never flushes."""
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    rank = EngineRank(shared_disk_config, RankAddresses(), podinfo_dir=str(podinfo))
    rank.core.start()
    try:
        assert rank.read_draining() is False
        (podinfo / "annotations").write_text(f'{DRAINING_ANNOTATION}="true"\n')
        assert rank.read_draining() is True
        assert rank.core.call_on_core(lambda: rank.core.drain.draining) is True
        (podinfo / "annotations").write_text(f'{DRAINING_ANNOTATION}="false"\n')
        assert rank.read_draining() is False
        assert rank.core.call_on_core(lambda: rank.core.drain.draining) is False
    finally:
        rank.core.stop()
