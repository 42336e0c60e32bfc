"""The device KV's byte budget, and one typical step for the engine and the simulator."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.kv.kv_budget import (
    GIB,
    DeviceMemory,
    kv_budget,
    probe_device_memory,
)
from kvfleet.services.engine.kv.kv_setup import build_kv, kvstore_config, typical_step
from kvfleet.services.replay.sim_config import ModelShape, load_sim_config
from kvfleet.services.replay.sim_sizing import rank_kvstore
from kvfleet.services.replay.sim_sizing import typical_step as sim_typical_step

MIB = 1 << 20
# An H200 as `torch.cuda.mem_get_info()` reports it: 143771 MiB, 600 MiB taken by the context.
H200 = DeviceMemory(free_bytes=(143771 - 600) * MIB, total_bytes=143771 * MIB)
CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def planned_bytes(model_name: str, config: EngineConfig, device, memory, dtype):
    """The device KV bytes a rank asks for, and its budget, without allocating anything."""
    model = preset(model_name)
    budget = kv_budget(model, config, device, memory, dtype)
    kv = build_kv(model, config, dtype, budget)
    pages = kv.store_config.pool_pages
    return sum(n * kv.layout.page_bytes(name) for name, n in pages.items()), budget


def test_8b_default_fits_an_h200_budget_and_warns_with_the_numbers(caplog):
    """If this fails, an 8b rank asks for more KV than the GPU has (384 GiB before), or stays
    silent about serving below its typical step's peak."""
    config = EngineConfig(model="8b")
    with caplog.at_level(logging.WARNING, logger="kvfleet.services.engine.kv.kv_setup"):
        used, budget = planned_bytes("8b", config, CUDA, H200, torch.bfloat16)
    assert used <= budget.budget_bytes < 0.9 * H200.total_bytes - 15 * GIB  # weights are ~15 GiB
    assert used > 0.95 * budget.budget_bytes  # the budget is used, not a sliver of it
    warning = "\n".join(r.getMessage() for r in caplog.records)
    assert "cannot hold the typical step's peak" in warning
    assert "256.05 GiB" in warning  # the peak: 8 slots + 8 conversations x one 128k context
    assert "0.9 x 140.40 GiB total" in warning


def test_1b_default_holds_its_peak_on_an_h200_without_a_warning(caplog):
    """If this fails, a 1b rank whose peak fits the GPU is cut down, or is warned for nothing."""
    config = EngineConfig(model="1b")
    with caplog.at_level(logging.WARNING):
        used, budget = planned_bytes("1b", config, CUDA, H200, torch.bfloat16)
    # The peak's pages (one context per slot, the retained turns' shares of it rounded up to
    # whole pages: + 24) and the null page.
    assert used == (131072 + 24 + 1) * 512 * 1024
    assert used <= budget.budget_bytes
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("model_name", ["1b", "8b"])
def test_cpu_default_is_bounded(model_name):
    """If this fails, a CPU rank of a big preset asks for 96-384 GiB of host memory."""
    plenty = DeviceMemory(free_bytes=512 * GIB, total_bytes=1024 * GIB)
    used, budget = planned_bytes(
        model_name, EngineConfig(model=model_name), CPU, plenty, torch.float32
    )
    assert used <= budget.budget_bytes == 4 * GIB
    scarce = DeviceMemory(free_bytes=4 * GIB, total_bytes=8 * GIB)
    used, budget = planned_bytes(
        model_name, EngineConfig(model=model_name), CPU, scarce, torch.float32
    )
    assert used <= budget.budget_bytes == GIB  # a quarter of the free host memory


def test_fraction_and_weights_shrink_the_gpu_budget():
    """If this fails, gpu_memory_fraction, the memory already in use or the weights are ignored."""
    model = preset("8b")
    config = EngineConfig(model="8b")
    full = kv_budget(model, config, CUDA, H200, torch.bfloat16).budget_bytes
    halved = dataclasses.replace(config, gpu_memory_fraction=0.5)
    half = kv_budget(model, halved, CUDA, H200, torch.bfloat16).budget_bytes
    assert full - half == pytest.approx(0.4 * H200.total_bytes, abs=1)
    busy = DeviceMemory(H200.free_bytes - 10 * GIB, H200.total_bytes)
    assert full - kv_budget(model, config, CUDA, busy, torch.bfloat16).budget_bytes == 10 * GIB
    weights = model.num_parameters() * 2
    empty = DeviceMemory(H200.total_bytes, H200.total_bytes)
    bare = int(0.9 * H200.total_bytes) - weights
    assert 0 < bare - kv_budget(model, config, CUDA, empty, torch.bfloat16).budget_bytes < 4 * GIB


def test_a_budget_too_small_for_the_pools_names_the_fix():
    """If this fails, a GPU too small for the weights starts with broken pools or a bare error."""
    small = DeviceMemory(free_bytes=16 * GIB, total_bytes=16 * GIB)
    with pytest.raises(ValueError, match="kv_pages"):
        planned_bytes("8b", EngineConfig(model="8b"), CUDA, small, torch.bfloat16)


def test_kv_pages_overrides_the_budget():
    """If this fails, a bench's explicit --kv-pages is resized by the budget."""
    small = DeviceMemory(free_bytes=GIB, total_bytes=GIB)
    config = EngineConfig(model="1b", kv_pages=64)
    used, _ = planned_bytes("1b", config, CPU, small, torch.float32)
    assert used == 64 * 1024 * 1024  # 64 pages of 1 MiB (fp32), whatever the budget


def test_mem_get_info_is_read_on_cuda_only():
    """If this fails, the GPU budget is not measured from mem_get_info (or CPU calls into CUDA)."""
    calls = []

    def fake_mem_get_info(device):
        calls.append(device)
        return H200.free_bytes, H200.total_bytes

    assert probe_device_memory(CUDA, fake_mem_get_info) == H200
    host = probe_device_memory(CPU, fake_mem_get_info)
    assert calls == [CUDA]
    assert 0 < host.free_bytes <= host.total_bytes


def test_engine_yaml_sets_the_fraction_and_the_cpu_cap():
    """If this fails, the operator's gpu_memory_fraction never reaches the budget."""
    config = engine_config_from_dict(
        {"kv_tiers": {"gpu_memory_fraction": 0.5}, "engine": {"cpu_kv_gib": 2}}
    )
    assert (config.gpu_memory_fraction, config.cpu_kv_gib) == (0.5, 2)
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        EngineConfig(gpu_memory_fraction=1.5)


BRANCHING = {"max_num_turns": 3, "keep_root": True, "keep_branch_points": 1}
POLICIES = [
    {"reuse_policy": "per_conversation", "max_num_turns": 2},
    {"reuse_policy": "per_conversation", **BRANCHING},
    {"reuse_policy": "per_request"},
]


def tiny_sim(policy: dict, gpu_pages: int, conversations: int):
    """A simulator arm shaped like the tiny model and the engine config's options."""
    model = preset("tiny")
    sim = load_sim_config(
        None,
        {
            "slots": "4",
            "block_size": "16",
            "chunk_tokens": "256",
            "max_context_tokens": str(model.max_position),
            "gpu_pages": str(gpu_pages),
            "retained_conversations": str(conversations),
            "checkpoint": "on",
            **{name: str(value) for name, value in policy.items()},
        },
    )
    window = {"kind": "window", "name": "window", "window_tokens": model.window_size}
    shape = ModelShape("tiny", 0.001, 3, 4, 2, 16, 4, ({"kind": "full", "name": "full"}, window))
    return sim.fleet, shape


@pytest.mark.parametrize("policy", POLICIES)
def test_engine_and_simulator_plan_the_same_pools(policy):
    """If this fails, the engine and the simulator size a rank's pools by two rules."""
    config = EngineConfig(
        max_batch_size=4, max_num_batched_tokens=256, retained_conversations=3, **policy
    )
    model = preset("tiny")
    budget = kv_budget(model, config, CPU, DeviceMemory(GIB, GIB), torch.float32)
    tight = dataclasses.replace(budget, budget_bytes=2 * MIB)  # below the peak: a real split
    engine = kvstore_config(model, config, tight, build_kv(model, config, torch.float32).layout)
    fleet, shape = tiny_sim(policy, sum(engine.pool_pages.values()), 3)
    sim, _ = rank_kvstore(fleet, shape)
    assert typical_step(model, config) == sim_typical_step(fleet, sim.reuse_policy)
    assert sim.life_cycles == engine.life_cycles
    assert dict(sim.pool_pages) == dict(engine.pool_pages)
    peak = kvstore_config(model, config)
    assert sum(peak.pool_pages.values()) > sum(engine.pool_pages.values())


def test_an_fp8_cache_gets_twice_the_pages_for_the_same_bytes():
    """If this fails, an fp8 fleet is sized at bf16 page bytes and keeps half the turns it
    could (or asks for more bytes than its budget)."""
    bf16 = EngineConfig(model="8b")
    fp8 = bf16.with_changes(kv_cache_dtype="fp8_e4m3")
    model = preset("8b")
    budget = kv_budget(model, bf16, CUDA, H200, torch.bfloat16)
    assert kv_budget(model, fp8, CUDA, H200, torch.bfloat16) == budget  # weights stay bf16
    pages = {}
    for name, config in (("bf16", bf16), ("fp8", fp8)):
        kv = build_kv(model, config, torch.bfloat16, budget)
        pages[name] = dict(kv.store_config.pool_pages)
        used = sum(n * kv.layout.page_bytes(pool) for pool, n in pages[name].items())
        assert 0.95 * budget.budget_bytes < used <= budget.budget_bytes
    assert kv.layout.dtype == "float8_e4m3fn"
    for pool, count in pages["bf16"].items():
        assert abs(pages["fp8"][pool] - 2 * count) <= 2, (pages, pool)
