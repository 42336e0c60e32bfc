"""A simulated rank's KV as bytes: pools split by page bytes, and the state pool's retained
snapshots (the hybrid SSM preset's pages and a tight one-rank scenario)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvfleet.kvstore.sizing import lower_tier_demand, plan_pools
from kvfleet.services.replay.sim_config import SimConfigError, load_sim_config
from kvfleet.services.replay.sim_sizing import GIB, rank_kvstore, rank_policy, typical_step
from kvfleet.services.replay.sim_target import SimTarget

BLOCK = 64
PRESET = Path(__file__).resolve().parents[2] / "bench" / "sim_hybrid_ssm.yaml"
MAMBA2_LAYER_STATE = (128 * 64 * 128 + 3 * (8192 + 2 * 8 * 128)) * 2  # bf16, hidden 4096
# One rank, one slot, small chunks: the state pool's peak is mostly the retained turns'.
TIGHT_MODEL = f"""model:
  life_cycles:
    - {{kind: full, name: full, layers: 8}}
    - {{kind: state, name: ssm, offsets_from_end: [0, 128], layers: 24,
       state_bytes: {MAMBA2_LAYER_STATE}}}
"""
CONVERSATIONS, FIRST_BLOCKS, ADDED_BLOCKS = 12, 40, 4
TIGHT_FLEET = {
    "ranks": "1",
    "slots": "1",
    "chunk_tokens": "512",
    "max_context_tokens": "4096",
    "max_num_turns": "1",
    "retained_conversations": str(CONVERSATIONS),
    "checkpoint": "off",
    "keep_branch_points": "0",  # unhinted prompts: branch windows would only loosen the split
}


def test_preset_pages_are_bytes_of_their_layers():
    """An attention page is 4 layers' K and V of 64 tokens; a state page 24 layers' states."""
    pages = load_sim_config(PRESET).model.page_bytes(BLOCK)
    assert pages["full"] == pages["swa"] == 4 * 2 * 8 * 128 * 2 * BLOCK == 1 << 20
    assert pages["ssm"] == 24 * MAMBA2_LAYER_STATE  # 49.4 MiB: one snapshot, 49 attention pages


def test_gpu_and_host_bytes_are_split_by_page_bytes():
    """The device pools take the rank's bytes (never more), in the plan's byte proportions,
    and the host tier's bytes follow what it holds: one conversation's context and endpoint per
    pool, by page bytes (`plan_lower_tier`), all of them given out."""
    config = load_sim_config(PRESET, {"gpu_gib": "20", "host_gib": "10", "slots": "4"})
    store, tiers = rank_kvstore(config.fleet, config.model)
    assert tiers is not None
    page_bytes = config.model.page_bytes(BLOCK)
    device = {name: pages * page_bytes[name] for name, pages in store.pool_pages.items()}
    assert 20 * GIB - sum(page_bytes.values()) < sum(device.values()) <= 20 * GIB
    host = {name: pages * page_bytes[name] for name, pages in tiers.host.capacity.items()}
    assert 10 * GIB - sum(page_bytes.values()) < sum(host.values()) <= 10 * GIB
    step = typical_step(config.fleet, rank_policy(config.fleet))
    held = lower_tier_demand(step, config.model.build_life_cycles(), BLOCK)
    weights = {name: held[name] * page_bytes[name] for name in held}
    for name in host:
        assert abs(host[name] / (10 * GIB) - weights[name] / sum(weights.values())) < 0.01, name


def test_negative_bytes_are_refused():
    """A negative byte budget names the option."""
    with pytest.raises(SimConfigError, match=r"gpu_gib=-1\.0"):
        load_sim_config(PRESET, {"gpu_gib": "-1"})


async def second_turn_reuse(model: Path, sizing: str) -> tuple[list[int], int]:
    """Each conversation's first turn, then each one's second turn, on one rank given the
    bytes of the sized plan's peak; the second turns' reused tokens and the conversations
    released under pressure."""
    sized = load_sim_config(model, TIGHT_FLEET)
    store, _ = rank_kvstore(sized.fleet, sized.model)
    peak = plan_pools(typical_step(sized.fleet, store.reuse_policy), store.life_cycles, BLOCK)
    page_bytes = sized.model.page_bytes(BLOCK)
    budget = sum(pages * page_bytes[name] for name, pages in peak.pool_pages.items())
    fleet = {**TIGHT_FLEET, "gpu_gib": repr(budget / GIB), "retained_snapshot_sizing": sizing}
    target = SimTarget(load_sim_config(model, fleet))
    prompts = [
        list(range(c * 10**5, c * 10**5 + FIRST_BLOCKS * BLOCK)) for c in range(CONVERSATIONS)
    ]
    added = [
        list(range(c * 10**5 + 50_000, c * 10**5 + 50_000 + ADDED_BLOCKS * BLOCK))
        for c in range(CONVERSATIONS)
    ]
    reused = []
    try:
        for conversation, prompt in enumerate(prompts):
            await target.generate(f"c{conversation}", prompt, 2)
        for conversation, prompt in enumerate(prompts):
            turn = await target.generate(f"c{conversation}", prompt + added[conversation], 2)
            reused.append(turn.cached_tokens)
    finally:
        await target.aclose()
    return reused, target.stats()["released_conversations"]


async def test_state_pool_runs_out_first_unless_retained_snapshots_are_counted(tmp_path):
    """If this fails, a byte split that leaves out the retained turns' from-end snapshots
    still holds them (the scenario is not tight), or the sized split no longer holds them:
    unsized, the state pool runs out while the full pool has room, conversations are released
    and their snapshots evicted, so later turns reuse nothing."""
    model = tmp_path / "tight.yaml"
    model.write_text(TIGHT_MODEL)
    reused, released = await second_turn_reuse(model, "on")
    assert (reused, released) == ([FIRST_BLOCKS * BLOCK] * CONVERSATIONS, 0)
    reused, released = await second_turn_reuse(model, "off")
    assert released > 0
    assert sum(reused) < FIRST_BLOCKS * BLOCK * CONVERSATIONS / 2, reused
