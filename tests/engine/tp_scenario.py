"""A fixed multi-step run over a paged KV cache, the same for a TP-1 model and a TP-2 leader:
chunked prefill, greedy decode, a second sequence that reuses the first one's prefix pages
(a prefix-cache hit), then both decoding in one batch. Returns every step's logits and the
greedy tokens.

Run as a script it is one tensor-parallel worker (gloo, file:// rendezvous): rank 0 leads and
saves the result, the others follow the leader's step plans.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

PAGE_SIZE, NUM_PAGES, CHUNK = 4, 48, 5
Forward = Callable[[list], torch.Tensor]


class Pages:
    """Hands out page ids 1, 2, ... (the kvstore's job in the engine)."""

    def __init__(self, groups) -> None:
        self.groups, self.next = list(groups), 1

    def take(self, count: int) -> list[int]:
        ids = list(range(self.next, self.next + count))
        self.next += count
        return ids


def _pages(groups, ids: list[int]) -> dict[str, list[int]]:
    return {g: list(ids) for g in groups}


def kv_bytes(config):
    """Device KV and a small host tier for `config`'s (a worker's) KV heads."""
    from kvfleet.kvstore.tiers.layout import KVLayout
    from kvfleet.kvstore.tiers.torch_bytes import TorchBytes
    from kvfleet.services.engine.kv.device_kv_cache import DeviceKVCache

    layout = KVLayout(
        PAGE_SIZE, config.num_kv_heads, config.head_dim, dict(config.groups), "float32"
    )
    groups = list(config.groups)
    tier = TorchBytes(layout, dict.fromkeys(groups, NUM_PAGES), dict.fromkeys(groups, 4), "cpu")
    return tier, DeviceKVCache(config, tier.kv)


def run_scenario(forward: Forward, groups, chunk_type, tier) -> dict:
    gen = torch.Generator().manual_seed(7)
    prompt_a = torch.randint(0, 256, (13,), generator=gen).tolist()
    prompt_b = prompt_a[:8] + torch.randint(0, 256, (6,), generator=gen).tolist()
    alloc = Pages(groups)
    pages_a = alloc.take(-(-(len(prompt_a) + 10) // PAGE_SIZE))
    logits: list[torch.Tensor] = []

    def step(chunks) -> torch.Tensor:
        out = forward(chunks)
        logits.append(out.clone())
        return out

    out = None
    for start in range(0, len(prompt_a), CHUNK):  # chunked prefill
        out = step([chunk_type(prompt_a[start : start + CHUNK], start, _pages(groups, pages_a))])
    seq_a = list(prompt_a)
    tokens_a = [int(out[0].argmax())]
    for _ in range(3):
        seq_a.append(tokens_a[-1])
        out = step([chunk_type([tokens_a[-1]], len(seq_a) - 1, _pages(groups, pages_a))])
        tokens_a.append(int(out[0].argmax()))
    # A's first two full pages (8 tokens) go to the host tier and come back in fresh pages;
    # B starts from those (a prefix hit after an onboard): only its own tail is computed.
    onboarded = alloc.take(2)
    for group in groups:
        tier.offload(group, pages_a[:2], [2, 3])
        tier.onboard(group, onboarded, [tier.host_row(group, slot) for slot in (2, 3)])
    pages_b = onboarded + alloc.take(-(-(len(prompt_b) + 10) // PAGE_SIZE) - 2)
    out = step([chunk_type(prompt_b[8:], 8, _pages(groups, pages_b))])
    seq_b, tokens_b = list(prompt_b), [int(out[0].argmax())]
    for _ in range(4):  # both sequences decode in one batch
        seq_a.append(tokens_a[-1])
        seq_b.append(tokens_b[-1])
        out = step(
            [
                chunk_type([tokens_a[-1]], len(seq_a) - 1, _pages(groups, pages_a)),
                chunk_type([tokens_b[-1]], len(seq_b) - 1, _pages(groups, pages_b)),
            ]
        )
        tokens_a.append(int(out[0].argmax()))
        tokens_b.append(int(out[1].argmax()))
    return {"tokens_a": tokens_a, "tokens_b": tokens_b, "logits": logits}


def _worker(args: argparse.Namespace) -> None:
    from kvfleet.services.engine.attention.backends import make_backend
    from kvfleet.services.engine.attention.batch import SequenceChunk
    from kvfleet.services.engine.compute.tp import (
        ShardedBytes,
        StepPlanFollower,
        TPLayout,
        broadcast_chunks,
        leader_forward,
        load_sharded_checkpoint,
    )
    from tp_testkit import worker_group

    torch.set_num_threads(1)
    with worker_group(args.rendezvous, args.rank, args.world):
        layout = TPLayout.from_process_group()
        model = load_sharded_checkpoint(args.checkpoint, layout, dtype=torch.float32)
        tier, cache = kv_bytes(model.config)
        backend = make_backend(None, "cpu")
        if layout.rank == 0:

            def forward(chunks):
                return leader_forward(model, cache, backend, chunks)

            groups = model.config.groups
            result = run_scenario(forward, groups, SequenceChunk, ShardedBytes(tier))
            broadcast_chunks(None)
            result["kv_heads"] = model.config.num_kv_heads
            torch.save(result, args.out)
        else:
            StepPlanFollower(model, cache, backend, tier).run()


if __name__ == "__main__":
    from tp_testkit import worker_arguments

    _worker(worker_arguments())
