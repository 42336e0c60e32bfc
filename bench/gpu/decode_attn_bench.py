"""Decode attention alone, one layer: flash-attn's paged kernel against the Triton split-KV
kernel (attn_decode_kernel.py) over bf16 and fp8 pages, at the serving benches' decode shapes,
against the copy bandwidth measured in the same run.

Each row times 20 calls replayed from one CUDA graph (as decode steps run), page 128, pages
scattered over a pool as a full cache leaves them. "KV share" is the KV bytes the call must read
(every key and value of every sequence, once) over the time, as a share of copy bandwidth. The
Triton rows sweep the partial kernel's tiling (keys per inner step / warps / stages); "flash-attn
split" is flash-attn with `kv_splits=0` (keys split outside the kernel when the batch's
(sequence, KV head) programs are fewer than the multiprocessors).

Run on the device (bench/gpu/kernel_round.sh): python3 bench/gpu/decode_attn_bench.py
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_common import import_engine, measure_ceilings, print_table, time_median

import_engine()
from kvfleet.services.engine.attention.attn_decode_kernel import (  # noqa: E402
    KernelShape,
    decode_attention,
)
from kvfleet.services.engine.attention.attn_flash import FlashAttention  # noqa: E402
from kvfleet.services.engine.attention.batch import AttentionMetadata  # noqa: E402

PAGE = 128
# (name, query heads, KV heads, head dim, batch, context): the 8b and 1b presets' attention.
CASES = [
    ("8b", 32, 8, 128, 64, 2048),
    ("8b", 32, 8, 128, 64, 8192),
    ("1b", 32, 8, 64, 256, 2048),
    ("8b", 32, 8, 128, 8, 8192),
    ("1b", 32, 8, 64, 2, 65536),  # a fleet rank's step: 2 slots of long agent contexts
]
SHAPES = [(64, 4, 3), (128, 4, 3), (128, 8, 3), (64, 4, 4), (128, 4, 4), (128, 8, 4), (256, 8, 3)]
CALLS = 20


def metadata(batch: int, ctx: int, pool: int, device) -> AttentionMetadata:
    width = -(-ctx // PAGE)
    ids = torch.randperm(pool - 1, device=device)[: batch * width] + 1
    return AttentionMetadata(
        cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32, device=device),
        seqused_k=torch.full((batch,), ctx, dtype=torch.int32, device=device),
        page_table=ids.int().view(batch, width),
        max_seqlen_q=1,
        max_seqlen_k=ctx,
        query_lens=(1,) * batch,
        context_lens=(ctx,) * batch,
        page_size=PAGE,
    )


def graphed(fn):
    """`fn` CALLS times captured into one CUDA graph; returns its replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return graph.replay


def variants_for(q, bf16, meta, scale) -> list:
    """(label, KV dtype, call) per kernel to time: flash-attn, then each Triton tiling over
    the same pages as bf16 and as fp8 (scales of 1)."""
    fp8 = [t.to(torch.float8_e4m3fn) for t in bf16]
    ones = torch.ones(bf16[0].shape[2], device=q.device)
    flash, split = FlashAttention(), FlashAttention(kv_splits=0)
    variants = [
        ("flash-attn", "bf16", lambda: flash.forward(q, *bf16, meta, None, scale)),
        ("flash-attn split", "bf16", lambda: split.forward(q, *bf16, meta, None, scale)),
    ]
    for keys, warps, stages in SHAPES:
        shape = KernelShape(keys, warps, stages)
        for dtype_name, pages, scales in (("bf16", bf16, None), ("fp8", fp8, (ones, ones))):
            variants.append((f"triton {keys}/{warps}/{stages}", dtype_name,
                             lambda p=pages, c=scales, s=shape: decode_attention(
                                 q, *p, meta, None, scale, c, s)))  # fmt: skip
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="indices into CASES, e.g. 0,2 (all)")
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth, _ = measure_ceilings(device, small=False)
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s ({torch.cuda.get_device_name()})")
    picked = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else CASES
    rows = []
    for name, heads, kv_heads, dim, batch, ctx in picked:
        width = -(-ctx // PAGE)
        pool = batch * width * 2
        meta = metadata(batch, ctx, pool, device)
        q = torch.randn(batch, heads, dim, device=device, dtype=torch.bfloat16)
        scale = dim**-0.5
        bf16 = [torch.randn(pool, PAGE, kv_heads, dim, device=device, dtype=torch.bfloat16)
                for _ in range(2)]  # fmt: skip
        variants = variants_for(q, bf16, meta, scale)
        reference = variants[0][2]().float()
        for label, dtype_name, fn in variants:
            try:
                result = fn()
                result = result[0] if isinstance(result, tuple) else result
                error = (result.float() - reference).abs().max().item()
                seconds = time_median(graphed(fn), device, warmup=2, reps=5) / CALLS
            except Exception as exc:  # a tiling that does not compile here: say so, go on
                print(f"{name} b{batch} ctx{ctx} {label} {dtype_name}: {type(exc).__name__}")
                continue
            kv_bytes = batch * ctx * kv_heads * dim * 2 * (2 if dtype_name == "bf16" else 1)
            share = kv_bytes / seconds / bandwidth
            rows.append([name, batch, ctx, label, dtype_name, seconds * 1e6, share, error])
            print(f"{name} b{batch} ctx{ctx} {label} {dtype_name}: {seconds * 1e6:.1f} us, "
                  f"{share:.2f} of copy BW", flush=True)  # fmt: skip
    print_table(
        f"decode attention, one layer, page {PAGE}, {CALLS} calls per CUDA graph",
        ["model", "batch", "ctx", "kernel", "KV", "us / call", "KV share of copy BW",
         "max abs diff vs flash"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
