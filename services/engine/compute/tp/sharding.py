"""One worker's share of the model: its sharded ModelConfig and the all-reduces that sum the
row-parallel partial outputs back into the full hidden state."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ...config.model_config import ModelConfig


@dataclass(frozen=True)
class TPLayout:
    """Which of `size` tensor-parallel workers this is (`size` 1: no parallelism)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor_parallel: rank {self.rank} outside 0..{self.size - 1}")

    @property
    def tag(self) -> str:
        """Part of a KV block's identity: bytes written by one layout are not another's."""
        return f"tp{self.size}r{self.rank}"

    def part(self, total: int) -> slice:
        """This worker's contiguous share of `total` rows (heads, columns)."""
        step = total // self.size
        return slice(self.rank * step, (self.rank + 1) * step)

    @classmethod
    def from_process_group(cls) -> TPLayout:
        if not dist.is_initialized():
            return cls()
        return cls(dist.get_rank(), dist.get_world_size())


def shard_config(config: ModelConfig, layout: TPLayout) -> ModelConfig:
    """The per-worker shape: heads, KV heads and MLP widths divided by `layout.size`."""
    if layout.size == 1:
        return config
    if config.attention_sinks or config.experts_kind != "swiglu":
        # NOTE: per-head sinks and gpt-oss's interleaved, biased experts have no split here yet.
        raise ValueError(
            f"model {config.name!r} ({config.architecture}): tensor_parallel={layout.size} "
            "does not split attention sinks or gpt-oss experts yet (serve it at "
            "tensor_parallel 1)"
        )
    sizes = {
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
    }
    if config.moe_layers:
        sizes["moe_intermediate_size"] = config.moe_intermediate_size
    uneven = {name: value for name, value in sizes.items() if value % layout.size}
    if uneven:
        raise ValueError(
            f"tensor_parallel={layout.size} does not divide the model's {uneven}; "
            "pick a tensor_parallel that divides every one of them"
        )
    return config.with_changes(**{name: value // layout.size for name, value in sizes.items()})


def _sum_partials(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(output)
    return output


def install_all_reduce(model: nn.Module, layout: TPLayout) -> int:
    """Hook one all-reduce after every row-parallel projection (o_proj, the MLP's output);
    returns how many were installed (none at TP-1)."""
    if layout.size == 1:
        return 0
    count = 0
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(_sum_partials)
        layer.mlp.register_forward_hook(_sum_partials)
        count += 2
    return count
