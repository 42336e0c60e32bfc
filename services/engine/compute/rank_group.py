"""Joining the rank's process group and a follower worker's life.

The launcher starts `tensor_parallel` processes of the engine (torchrun sets RANK, WORLD_SIZE,
MASTER_ADDR/PORT for the `env://` rendezvous); process 0 serves (scheduler, kvstore, gRPC),
the others call `follow` and run what it sends. NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

from ....kvstore.tiers.torch_bytes import TorchBytes
from ..attention.backends import make_backend
from ..config.engine_config import EngineConfig
from ..kv.device_kv_cache import DeviceKVCache
from ..kv.kv_setup import kv_layout
from .device import resolve_device
from .tp.loading import load_sharded_checkpoint
from .tp.sharding import TPLayout
from .tp.step_plan import StepPlanFollower


def join_rank_group(config: EngineConfig, device: torch.device) -> TPLayout:
    """This process's place in the rank (TP-1: alone, no process group)."""
    if config.tensor_parallel == 1:
        return TPLayout()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    layout = TPLayout.from_process_group()
    if layout.size != config.tensor_parallel:
        raise ValueError(
            f"tensor_parallel={config.tensor_parallel} but the launcher started "
            f"{layout.size} workers"
        )
    return layout


def leave_rank_group() -> None:
    """Every worker meets the others, then tears its process group down. A worker that closes
    its connections while a peer may still use them can take that peer down with it (gloo's
    threads call std::terminate), so nobody leaves before everyone is done. The collection
    frees what still holds the group while the interpreter is whole: a gloo group destroyed
    during interpreter shutdown aborts the process."""
    if not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def worker_device(device: torch.device, layout: TPLayout) -> torch.device:
    """One GPU per worker (the pod's GPUs in worker order); CPU stays CPU."""
    if device.type != "cuda" or layout.size == 1:
        return device
    torch.cuda.set_device(layout.rank)
    return torch.device("cuda", layout.rank)


def follow(config: EngineConfig) -> int:
    """A worker other than 0: load its shard, then carry out the leader's orders until it
    says stop; returns how many it carried out."""
    torch.set_num_threads(config.torch_threads)
    device = resolve_device(config.device)
    layout = join_rank_group(config, device)
    if layout.rank == 0:
        raise ValueError("worker 0 leads the rank: it serves, it does not follow")
    device = worker_device(device, layout)
    chosen = None if config.dtype == "auto" else getattr(torch, config.dtype)
    model = load_sharded_checkpoint(config.model_path, layout, device, chosen)
    dtype = next(model.parameters()).dtype

    def open_kv(pool_pages: dict, host_pages: dict):
        layout = kv_layout(model.config, config, dtype)
        store = TorchBytes(layout, pool_pages, host_pages, device)
        return DeviceKVCache(model.config, store.kv), store

    backend = make_backend(config.attention_backend, device)
    return StepPlanFollower(model, None, backend, open_kv=open_kv).run()
