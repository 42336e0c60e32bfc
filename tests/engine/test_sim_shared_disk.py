"""Ranks of the `sim` compute backend share a disk folder as torch ranks do (marker files).

Rank A (tiny shape, no tensors) serves turn 1 of a conversation (150 tokens, pages of 16) and
drains: its retained 9 full + 6 window blocks go to the shared folder. Rank B, fresh, serves
turn 2 and resumes at turn 1's prompt end (144 tokens) from there.
"""

from __future__ import annotations

from engine_testkit import final, run_call, tokens_of, turn_two, two_turns
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore

SIM = EngineConfig(
    model="tiny",
    compute_backend="sim",
    sim_time_scale=0.0,
    max_batch_size=4,
    max_num_batched_tokens=48,
    page_size=16,
    kv_pages=160,
    checkpoint_margin_tokens=32,
)


def test_a_drained_sim_ranks_prefix_reaches_another_sim_rank(tmp_path):
    """With each sim rank's disk its own, the drained conversation would recompute on B."""
    config = SIM.with_changes(disk_tier_dir=str(tmp_path), disk_kv_pages=256)
    first, appended = two_turns(1, "sim")
    a = EngineCore(config).start()
    try:
        second = turn_two(first, tokens_of(run_call(a, first)), appended)
        a.set_draining(True)
        a.call_on_core(lambda: None)  # commands run in order: the flush has run
        a.check_integrity()
    finally:
        a.stop()
    b = EngineCore(config).start()
    try:
        assert final(run_call(b, second)).usage.cached_tokens == 9 * 16
        b.check_integrity()
    finally:
        b.stop()
