"""How many bytes a rank's device KV may take.

On CUDA: `total x gpu_memory_fraction`, less what was already in use before the weights loaded
(`total - free` of `torch.cuda.mem_get_info()`), the weights, and an activation reserve for
one step (`max_num_batched_tokens` tokens through the widest layer, plus the sampled rows'
logits and a fixed allocator margin). On CPU: at most `cpu_kv_gib`, and at most a quarter of
the host memory that is free. The pools then hold the typical step's peak when it fits the
budget, and the budget split by the typical step when it does not (kv_setup.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config.engine_config import EngineConfig
from ..config.model_config import ModelConfig

GIB = 1 << 30
# Allocator fragmentation, cuBLAS workspaces and the CUDA context's growth during a step.
ACTIVATION_MARGIN_BYTES = GIB
HOST_FREE_FRACTION = 0.25  # CPU ranks: the most of the host's free memory the KV may take


@dataclass(frozen=True)
class DeviceMemory:
    """A device's memory as `torch.cuda.mem_get_info()` reports it (bytes)."""

    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class KVBudget:
    """The device KV's bytes, and the figures they come from (for the logs)."""

    budget_bytes: int
    explanation: str


def probe_device_memory(
    device: torch.device,
    mem_get_info: Callable[[torch.device], tuple[int, int]] = torch.cuda.mem_get_info,
) -> DeviceMemory:
    """Free and total bytes of `device` (CUDA: mem_get_info; CPU: the host's available memory,
    page cache included, as /proc/meminfo's MemAvailable says)."""
    if device.type == "cuda":
        free, total = mem_get_info(device)
        return DeviceMemory(int(free), int(total))
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    return DeviceMemory(_host_available_bytes() or os.sysconf("SC_AVPHYS_PAGES") * page, total)


def _host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def weight_bytes(model: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of the model's weights in `dtype`."""
    return model.num_parameters() * dtype.itemsize


def activation_reserve_bytes(model: ModelConfig, config: EngineConfig, dtype: torch.dtype) -> int:
    """A step's peak transient memory: `max_num_batched_tokens` tokens through one layer
    (residual, norm, q/k/v, attention out, gate/up/act of the MLP, each kept twice for
    temporaries), the logits of one sampled row per slot in fp32, and a fixed margin."""
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    per_token = 2 * (3 * model.hidden_size + q + 2 * kv + q + 3 * model.intermediate_size)
    tokens = config.max_num_batched_tokens * per_token * dtype.itemsize
    logits = config.max_batch_size * model.vocab_size * (dtype.itemsize + 4)
    return tokens + logits + ACTIVATION_MARGIN_BYTES


def gpu_kv_budget(
    memory: DeviceMemory, fraction: float, weights: int, activations: int
) -> KVBudget:
    """`total x fraction - in use - weights - activations` (never below zero)."""
    in_use = memory.total_bytes - memory.free_bytes
    budget = int(memory.total_bytes * fraction) - in_use - weights - activations
    explanation = (
        f"{fraction:g} x {_gib(memory.total_bytes)} total - {_gib(in_use)} in use - "
        f"{_gib(weights)} weights - {_gib(activations)} activations = {_gib(budget)}"
    )
    return KVBudget(max(0, budget), explanation)


def cpu_kv_budget(memory: DeviceMemory, cap_gib: float) -> KVBudget:
    """The smaller of `cap_gib` and a quarter of the host's free memory."""
    cap = int(cap_gib * GIB)
    share = int(memory.free_bytes * HOST_FREE_FRACTION)
    explanation = (
        f"cpu: min(cpu_kv_gib {_gib(cap)}, {HOST_FREE_FRACTION:g} x {_gib(memory.free_bytes)} "
        f"free host memory) = {_gib(min(cap, share))}"
    )
    return KVBudget(min(cap, share), explanation)


def kv_budget(
    model: ModelConfig,
    config: EngineConfig,
    device: torch.device,
    memory: DeviceMemory,
    dtype: torch.dtype,
) -> KVBudget:
    """The device KV's budget of a rank on `device` (memory measured before the weights)."""
    if device.type == "cuda":
        weights = weight_bytes(model, dtype)
        activations = activation_reserve_bytes(model, config, dtype)
        return gpu_kv_budget(memory, config.gpu_memory_fraction, weights, activations)
    return cpu_kv_budget(memory, config.cpu_kv_gib)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"
