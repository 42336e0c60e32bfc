"""Run under TRITON_INTERPRET=1 (tests/engine/test_attn_decode_kernel.py starts it): the fp8
paged decode kernel against the reference backend's fp32 math over the same fp8 pages, with
GQA, scattered pages, a window, split parts, an empty sequence (a graph's pad row) and sinks."""

from __future__ import annotations

import sys

import torch
from kvfleet.services.engine.attention.attn_decode_kernel import (
    KernelShape,
    decode_attention,
    shape_for,
)
from kvfleet.services.engine.attention.attn_flash import with_sinks
from kvfleet.services.engine.attention.attn_reference import ReferenceAttention
from kvfleet.services.engine.attention.batch import AttentionMetadata
from kvfleet.services.engine.kv.kv_quant import quantize


def check(
    lens, heads, kv_heads, head_dim, page, window, seed, sinks=False, fp8=True, shape=None
) -> float:
    """Max relative difference from the reference; `fp8` False: bf16 pages, no scales."""
    gen = torch.Generator().manual_seed(seed)
    pages_each = [-(-n // page) for n in lens]
    width = max(pages_each) + 1
    num_pages = sum(pages_each) + 3
    order = torch.randperm(num_pages - 1, generator=gen)[: sum(pages_each)] + 1  # 0: null page
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for b, count in enumerate(pages_each):
        table[b, :count] = order[used : used + count].int()
        used += count
    scales = (2.0 ** torch.randint(-2, 3, (kv_heads,), generator=gen)).float()
    raw = torch.randn(2, num_pages * page, kv_heads, head_dim, generator=gen) * scales[:, None]
    if fp8:
        k = quantize(raw[0], scales).view(num_pages, page, kv_heads, head_dim)
        v = quantize(raw[1], scales).view(num_pages, page, kv_heads, head_dim)
    else:
        k, v = (t.to(torch.bfloat16).view(num_pages, page, kv_heads, head_dim) for t in raw)
    kv_scales = (scales, scales) if fp8 else None
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(torch.bfloat16)
    meta = AttentionMetadata(
        cu_seqlens_q=torch.arange(len(lens) + 1, dtype=torch.int32),
        seqused_k=torch.tensor(lens, dtype=torch.int32),
        page_table=table,
        max_seqlen_q=1,
        max_seqlen_k=max(lens),
        query_lens=(1,) * len(lens),
        context_lens=tuple(lens),
        page_size=page,
    )
    sink = torch.randn(heads, generator=gen) if sinks else None
    scale = head_dim**-0.5
    out, lse = decode_attention(q, k, v, meta, window, scale, kv_scales, shape)
    if sink is not None:
        out = with_sinks(out, lse, sink)
    live = [b for b, n in enumerate(lens) if n > 0]
    assert all(out[b].abs().max() == 0 for b in range(len(lens)) if lens[b] == 0), "pad row"
    real = AttentionMetadata(
        cu_seqlens_q=torch.arange(len(live) + 1, dtype=torch.int32),
        seqused_k=meta.seqused_k[live],
        page_table=table[live],
        max_seqlen_q=1,
        max_seqlen_k=max(lens),
        query_lens=(1,) * len(live),
        context_lens=tuple(lens[b] for b in live),
        page_size=page,
    )
    expected = ReferenceAttention().forward(
        q[live], k, v, real, window, scale, sink, kv_scales=kv_scales
    )
    # Both outputs are rounded to bf16: compare within a few bf16 steps of the value.
    error = (out[live].float() - expected.float()).abs() / expected.float().abs().clamp_min(1.0)
    return error.max().item()


def main() -> int:
    # The tiling per head dim: the sweep's picks, and a power of two for any head dim.
    picks = {dim: shape_for(dim).keys_per_block for dim in (16, 64, 80, 96, 128, 256)}
    assert picks == {16: 128, 64: 128, 80: 64, 96: 64, 128: 64, 256: 64}, picks
    worst = max(
        check([1, 37, 300, 0, 129], heads=8, kv_heads=2, head_dim=32, page=16, window=None, seed=1),
        check([200, 64, 5], heads=6, kv_heads=2, head_dim=24, page=16, window=48, seed=2),
        check([90, 17], heads=4, kv_heads=4, head_dim=16, page=8, window=None, seed=3, sinks=True),
        # one sequence, one KV head: its keys in 5 parts, merged (and with a window, 2 of them)
        check([300], heads=4, kv_heads=1, head_dim=16, page=16, window=None, seed=4),
        check([300], heads=4, kv_heads=1, head_dim=16, page=16, window=100, seed=5),
        # bf16 pages read as they are (no scales), and another tiling than the default
        check(
            [1, 37, 300, 0, 129],
            heads=8,
            kv_heads=2,
            head_dim=32,
            page=16,
            window=None,
            seed=6,
            fp8=False,
        ),
        check(
            [200, 64, 5],
            heads=6,
            kv_heads=2,
            head_dim=24,
            page=16,
            window=48,
            seed=7,
            fp8=False,
            shape=KernelShape(keys_per_block=128, num_warps=8),
        ),
    )
    print(f"max difference (relative, at least 1) {worst:.3g}")
    return 0 if worst < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
