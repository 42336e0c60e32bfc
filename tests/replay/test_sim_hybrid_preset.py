"""The simulator's hybrid SSM preset builds, and its pools count retained turns' snapshots."""

from pathlib import Path

from kvfleet.kvstore.life_cycles import StateLifeCycle
from kvfleet.services.replay.sim_config import load_sim_config
from kvfleet.services.replay.sim_sizing import rank_kvstore

PRESET = Path(__file__).resolve().parents[2] / "bench" / "sim_hybrid_ssm.yaml"


def state_demand(sizing: str) -> int:
    overrides = {"max_num_turns": "3", "retained_conversations": "16", "gpu_pages": "100000"}
    config = load_sim_config(PRESET, {**overrides, "retained_snapshot_sizing": sizing})
    store, _ = rank_kvstore(config.fleet, config.model)
    return store.pool_pages["ssm"]


def test_preset_has_an_ssm_pool_with_a_from_end_offset():
    config = load_sim_config(PRESET)
    (ssm,) = [lc for lc in config.model.build_life_cycles() if isinstance(lc, StateLifeCycle)]
    assert ssm.num_extra_from_end == 1
    assert {lc.kind for lc in config.model.build_life_cycles()} == {"full", "window", "state"}


def test_retained_snapshot_sizing_gives_the_state_pool_one_page_per_retained_turn():
    # 16 conversations x 3 turns x one from-end snapshot, in proportion of 100000 pages
    assert state_demand("on") > state_demand("off")
