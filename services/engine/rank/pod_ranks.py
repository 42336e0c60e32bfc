"""The ranks one engine process (one pod) runs: `ranks_per_pod` of them, rank i on the base
ports + i and, on CUDA, on GPU i; with one rank the addresses are used as given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ..config.engine_config import EngineConfig
from .engine_rank import RankAddresses


def _offset(port: int | None, index: int) -> int | None:
    # Port 0 (any free port) and None (not served) stay as they are for every rank.
    return port + index if port else port


def rank_device(
    device: str,
    index: int,
    count: int,
    cuda_available: Callable[[], bool] = torch.cuda.is_available,
) -> str:
    """Rank `index`'s device: `cuda` (and `auto` where CUDA is present) is split one GPU per
    rank; anything else is kept (`auto` without CUDA then warns once per rank, on the CPU)."""
    if count > 1 and (device == "cuda" or (device == "auto" and cuda_available())):
        return f"cuda:{index}"
    return device


def pod_ranks(
    config: EngineConfig, addresses: RankAddresses
) -> list[tuple[EngineConfig, RankAddresses]]:
    """(config, addresses) of every rank of this pod, in order."""
    count = config.ranks_per_pod
    if count == 1:
        return [(config, addresses)]
    return [
        (
            config.with_changes(device=rank_device(config.device, index, count)),
            dataclasses.replace(
                addresses,
                grpc_port=_offset(addresses.grpc_port, index),
                http_port=_offset(addresses.http_port, index),
                metrics_port=_offset(addresses.metrics_port, index),
                rank_id=f"{addresses.rank_id}-{index}",
            ),
        )
        for index in range(count)
    ]
