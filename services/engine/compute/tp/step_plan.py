"""The leader's orders, sent to every worker of the rank: forward steps and tier copies.

Only worker 0 (the leader) runs the scheduler and the kvstore. Before each forward it sends the
step's chunks (new tokens, cached length, page ids per layer group), and before each tier copy
the copy (life cycle, device pages, host slots), as plain Python data through
`torch.distributed.broadcast_object_list`. Each worker builds the same `ForwardBatch` over its
own KV shard and runs the same forward, so the all-reduces inside line up, and makes the same
copies of its own shard. Fresh tiers (a new manager) are an order too, and None tells the
workers to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ...attention.backends import AttentionBackend
from ...attention.batch import ForwardBatch, SequenceChunk
from ...kv.kv_cache import PagedKVCache
from ...model.decoder import CausalLM

STEP, OFFLOAD, ONBOARD, OPEN = "step", "offload", "onboard", "open"


def _send(message: tuple | None) -> tuple | None:
    box: list[Any] = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def send_to_workers(message: tuple | None) -> None:
    """Leader: one order (None: stop) to every worker; a no-op outside a process group."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        _send(message)


def broadcast_chunks(chunks: Sequence[SequenceChunk] | None, all_logits: bool = False) -> None:
    """Leader: send one forward step (None: stop)."""
    if chunks is None:
        send_to_workers(None)
        return
    plan = [
        (list(c.new_tokens), c.num_cached, {g: list(p) for g, p in c.page_ids.items()})
        for c in chunks
    ]
    send_to_workers((STEP, plan, all_logits))


class StepPlanFollower:
    """A worker's side: run every order the leader sends over this worker's model, cache and
    (when the rank has tiers) host rows."""

    def __init__(
        self,
        model: CausalLM,
        cache: PagedKVCache,
        backend: AttentionBackend,
        tier_bytes: Any = None,
        open_kv: Callable[[dict, dict], tuple[PagedKVCache, Any]] | None = None,
    ) -> None:
        """`open_kv(pool_pages, host_pages)`: a fresh (cache, tier bytes) when the leader opens
        new tiers."""
        self.model, self.cache, self.backend, self.tier_bytes = model, cache, backend, tier_bytes
        self.open_kv = open_kv

    def step(self) -> bool:
        """Carry out one order; False once the leader said stop."""
        message = _send(None)
        if message is None:
            return False
        kind = message[0]
        if kind == STEP:
            _, plan, all_logits = message
            chunks = [SequenceChunk(tokens, cached, pages) for tokens, cached, pages in plan]
            batch = ForwardBatch.build(chunks, self.cache)
            self.model(batch, self.cache, self.backend, all_logits=all_logits)
        elif kind == OFFLOAD:
            _, life_cycle, pages, slots = message
            self.tier_bytes.offload(life_cycle, pages, slots)
        elif kind == ONBOARD:
            _, life_cycle, pages, slots = message
            rows = [self.tier_bytes.host_row(life_cycle, slot) for slot in slots]
            self.tier_bytes.onboard(life_cycle, pages, rows)
        elif kind == OPEN and self.open_kv is not None:
            _, pool_pages, host_pages = message
            self.cache, self.tier_bytes = self.open_kv(pool_pages, host_pages)
        else:
            raise ValueError(f"unknown order {kind!r} from the tensor-parallel leader")
        return True

    def run(self) -> int:
        """Follow until stopped; returns the number of orders carried out."""
        count = 0
        while self.step():
            count += 1
        return count


def leader_forward(
    model: CausalLM,
    cache: PagedKVCache,
    backend: AttentionBackend,
    chunks: Sequence[SequenceChunk],
    all_logits: bool = False,
) -> torch.Tensor:
    """Leader: send the plan, then run the same forward; returns the full logits."""
    broadcast_chunks(chunks, all_logits)
    return model(ForwardBatch.build(list(chunks), cache), cache, backend, all_logits=all_logits)
