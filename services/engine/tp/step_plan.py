"""The leader's step plan, sent to every worker of the rank before each forward.

Only worker 0 (the leader) runs the scheduler and the kvstore; a step's plan is its chunks
(new tokens, cached length, page ids per layer group), plain Python data sent with
`torch.distributed.broadcast_object_list`. Each worker builds the same `ForwardBatch` over
its own KV shard and runs the same forward, so the all-reduces inside line up. A plan of
None tells the workers to stop.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..attention import AttentionBackend
from ..batch import ForwardBatch, SequenceChunk
from ..kv_cache import PagedKVCache
from ..model import CausalLM

Plan = tuple[list[tuple[list[int], int, dict[str, list[int]]]], bool] | None


def _send(plan: Plan) -> Plan:
    box = [plan]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_chunks(chunks: Sequence[SequenceChunk] | None, all_logits: bool = False) -> Plan:
    """Leader: send the step (None: stop); workers call `StepPlanFollower` instead."""
    if chunks is None:
        return _send(None)
    plan = (
        [
            (list(c.new_tokens), c.num_cached, {g: list(p) for g, p in c.page_ids.items()})
            for c in chunks
        ],
        all_logits,
    )
    return _send(plan)


def _chunks(plan: Plan) -> list[SequenceChunk]:
    return [SequenceChunk(tokens, cached, pages) for tokens, cached, pages in plan[0]]


class StepPlanFollower:
    """A worker's side: run every step the leader plans over this worker's model and cache."""

    def __init__(self, model: CausalLM, cache: PagedKVCache, backend: AttentionBackend) -> None:
        self.model, self.cache, self.backend = model, cache, backend

    def step(self) -> bool:
        """Run one planned step; False once the leader said stop."""
        plan = _send(None)
        if plan is None:
            return False
        batch = ForwardBatch.build(_chunks(plan), self.cache)
        self.model(batch, self.cache, self.backend, all_logits=plan[1])
        return True

    def run(self) -> int:
        """Follow until stopped; returns the number of steps run."""
        steps = 0
        while self.step():
            steps += 1
        return steps


def leader_forward(
    model: CausalLM,
    cache: PagedKVCache,
    backend: AttentionBackend,
    chunks: Sequence[SequenceChunk],
    all_logits: bool = False,
) -> torch.Tensor:
    """Leader: send the plan, then run the same forward; returns the full logits."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        broadcast_chunks(chunks, all_logits)
    return model(ForwardBatch.build(list(chunks), cache), cache, backend, all_logits=all_logits)
