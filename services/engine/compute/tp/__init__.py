"""Tensor parallelism inside one engine rank, on torch.distributed (NCCL on GPUs, gloo on CPU).

A rank of `tensor_parallel = tp` workers splits every layer Megatron-style: q/k/v and MLP
gate/up column-parallel (each worker owns `heads / tp` query heads, `kv_heads / tp` KV heads
and `intermediate / tp` MLP columns, per expert for MoE), o_proj and down_proj row-parallel
with one all-reduce after each. Embeddings, norms, the MoE router and the LM head are
replicated, so every worker ends a forward with the full logits. Each worker's KV cache holds
its KV heads' shard of every page: the page ids are the leader's, the bytes are per worker.
"""

from .loading import load_sharded_checkpoint
from .sharded_bytes import ShardedBytes
from .sharding import TPLayout, install_all_reduce, shard_config
from .step_plan import StepPlanFollower, broadcast_chunks, leader_forward, send_to_workers

__all__ = [
    "ShardedBytes",
    "StepPlanFollower",
    "TPLayout",
    "broadcast_chunks",
    "install_all_reduce",
    "leader_forward",
    "load_sharded_checkpoint",
    "send_to_workers",
    "shard_config",
]
