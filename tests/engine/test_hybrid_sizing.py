"""A hybrid model's state pages are sized by their own bytes: pool sizing and the device KV
budget count both pools, so the 8b-shaped hybrid fits an H200 and its small twin serves."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testkit import final, greedy, run_call, shared_compute, tokens_of
from kvfleet.kvstore.sizing import plan_pools
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.kv.kv_budget import DeviceMemory, KVBudget, kv_budget
from kvfleet.services.engine.kv.kv_setup import build_kv, kv_layout, life_cycles_for, typical_step
from kvfleet.services.engine.request.engine_request import GenerateCall, InvalidRequestError

MIB = 1 << 20
H200 = DeviceMemory(free_bytes=(143771 - 600) * MIB, total_bytes=143771 * MIB)
SMALL = EngineConfig(
    model="hybrid-small",
    max_batch_size=2,
    max_num_batched_tokens=48,
    page_size=16,
    kv_pages=64,
    state_offsets_from_end=(0, 32),
)


def _pool_bytes(kv) -> dict[str, int]:
    pages = kv.store_config.pool_pages
    return {name: count * kv.layout.page_bytes(name) for name, count in pages.items()}


def test_a_state_page_holds_one_fp32_state_per_ssm_layer():
    """If this fails, state pages borrow the attention page's shape (and an 8b state no longer
    fits one) or lose the fp32 a resumed scan needs under a bf16 KV."""
    model = preset("hybrid-8b")
    layout = kv_layout(model, EngineConfig(model="hybrid-8b"), torch.bfloat16)
    assert model.ssm_state_floats == 537344
    assert layout.page_bytes("ssm") == 24 * 537344 * 4
    assert layout.page_bytes("full") == 8 * 2 * 16 * 8 * 128 * 2
    assert layout.page_shape("ssm") == (24, 1, 1, 1, 537344 * 2)
    small = kv_layout(preset("hybrid-small"), SMALL, torch.float32)
    per_layer = {name: small.page_bytes(name) // len(small.layers[name]) for name in small.layers}
    assert per_layer["ssm"] > per_layer["full"]  # the 8b structure: a state outgrows a page


def test_8b_hybrid_fits_an_h200_with_both_pools_at_their_peak():
    """The typical step's peak of both pools, counted in their own bytes, within the budget."""
    config = EngineConfig(model="hybrid-8b")
    model = preset("hybrid-8b")
    budget = kv_budget(model, config, torch.device("cuda"), H200, torch.bfloat16)
    kv = build_kv(model, config, torch.bfloat16, budget)
    peak = plan_pools(typical_step(model, config), life_cycles_for(model, config), 16).pool_pages
    assert dict(kv.store_config.pool_pages) == dict(peak)
    assert sum(_pool_bytes(kv).values()) <= budget.budget_bytes
    assert _pool_bytes(kv)["ssm"] > 5 * 2**30  # the state pool is no rounding error


@pytest.mark.parametrize("step_tokens", [256, 2048])
def test_8b_hybrid_state_pages_do_not_grow_with_the_step(step_tokens):
    """8 slots x (resume, running, endpoint, checkpoint, 512 before the end, a branch point) +
    8 conversations x (5 turns x (endpoint, checkpoint, 512 before the end) + 2 branch records),
    plus the null page: 185 pages (8.9 GiB) at 256- and 2048-token steps alike. A page at every
    block a chunk passes would add one per block the step spans, per slot."""
    config = EngineConfig(model="hybrid-8b", max_num_batched_tokens=step_tokens)
    model = preset("hybrid-8b")
    plan = plan_pools(typical_step(model, config), life_cycles_for(model, config), 16)
    assert plan.pool_pages["ssm"] == 8 * 6 + 8 * (5 * 3 + 2) + 1


def test_a_budget_short_of_the_peak_buys_pages_by_each_pools_bytes():
    """If state pages were priced as attention pages, the pools would overshoot the budget
    (192 state pages are 9.2 GiB, not 0.1 GiB)."""
    config = EngineConfig(model="hybrid-8b")
    model = preset("hybrid-8b")
    budget = KVBudget(20 * 2**30, "20 GiB for the test")
    kv = build_kv(model, config, torch.bfloat16, budget)
    spent = _pool_bytes(kv)
    assert sum(spent.values()) <= budget.budget_bytes
    assert spent["ssm"] > 0 and spent["full"] > 0
    assert sum(spent.values()) > 0.95 * budget.budget_bytes  # and it spends what it has


def test_small_hybrid_serves_a_returning_turn_like_a_recompute():
    """The 8b structure at tiny widths through EngineCore: state pages of their own size are
    restored on a prefix match with the same greedy tokens as an empty cache."""
    rng = random.Random(2)
    first = GenerateCall("s-t1", tuple(rng.randrange(256) for _ in range(100)), greedy(6), "s")
    core = EngineCore(SMALL, compute=shared_compute(SMALL, "small-cached")).start()
    try:
        out1 = tokens_of(run_call(core, first))
        prompt = (*first.prompt_token_ids, *out1, *(rng.randrange(256) for _ in range(20)))
        second = GenerateCall("s-t2", prompt, greedy(6), "s")
        outputs = run_call(core, second)
        assert final(outputs).usage.cached_tokens == 96
        fresh = EngineCore(SMALL, compute=shared_compute(SMALL, "small-fresh")).start()
        try:
            assert tokens_of(outputs) == tokens_of(run_call(fresh, second))
        finally:
            fresh.stop()
        core.check_integrity()
        core.call_on_core(core.compute.cache.check_integrity)
    finally:
        core.stop()


def test_a_prompt_whose_states_outgrow_the_state_pool_is_refused_by_name():
    config = SMALL.with_changes(kv_pool_pages=(("ssm", 4),))
    core = EngineCore(config, compute=shared_compute(config, "small-tight"))
    call = GenerateCall("big", tuple(range(200)), greedy(4), "big")
    with pytest.raises(InvalidRequestError, match="pool 'ssm' of 3"):
        core.validate(call)


def test_engine_yaml_sets_the_snapshot_boundaries():
    """engine.yaml's `engine:` section takes a list; the state life cycle gets a tuple."""
    from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict

    config = engine_config_from_dict(
        {"model": "hybrid-tiny", "engine": {"state_every_tokens": 4096,
                                            "state_offsets_from_end": [256, 0]}}
    )  # fmt: skip
    state = life_cycles_for(preset("hybrid-tiny"), config)[0]
    assert (state.kind, state.every_tokens, state.offsets_from_end) == ("state", 4096, (0, 256))
    with pytest.raises(ValueError, match="must be >= 0"):
        EngineConfig(state_offsets_from_end=(-1,))


def test_a_long_chunked_prefill_runs_in_a_state_pool_of_the_new_peak():
    """A 400-token prompt in 128-token steps (8 blocks each) through EngineCore with the state
    pool cut to one request's planned peak (5 pages: resume, running, endpoint, checkpoint,
    32 before the end): it finishes with the tokens of a roomy pool. A page at every block a
    chunk passes needs 8 for its first chunk, which never fits."""
    rng = random.Random(5)
    call = GenerateCall("long", tuple(rng.randrange(256) for _ in range(400)), greedy(4), "l")
    config = SMALL.with_changes(max_num_batched_tokens=128)
    tight = config.with_changes(kv_pool_pages=(("ssm", 6),))
    core = EngineCore(tight, compute=shared_compute(tight, "small-peak")).start()
    try:
        outputs = run_call(core, call)
        core.check_integrity()
        core.call_on_core(core.compute.cache.check_integrity)
    finally:
        core.stop()
    roomy = EngineCore(config, compute=shared_compute(config, "small-roomy")).start()
    try:
        assert tokens_of(outputs) == tokens_of(run_call(roomy, call))
    finally:
        roomy.stop()
