"""A decode step's matmuls alone: each projection of the 8b shape at decode batch sizes, as
separate matmuls and packed (q/k/v as one, gate/up as one: model/packed.py), against the copy
bandwidth measured in the same run.

At decode a matmul reads its whole weight for a few rows, so "weight share" (the weight's bytes
over the time, as a share of copy bandwidth) is how near it runs to its floor. Each row replays
one CUDA graph that cycles through distinct copies of the weight (at least 512 MB of them), so
no call finds its weight in L2 as a real step would not. The packed shapes are timed again
with cuBLASLt preferred over cuBLAS (torch's `preferred_blas_library`), and with `--autotune`
by inductor's max-autotune (Triton templates benchmarked against cuBLAS). `--triton` sweeps
the tilings of kvfleet's own decode matmul kernel (model/decode_matmul_kernel.py) over every
shape at batches of at most 64 rows, prints the best of each beside cuBLAS, and with
`--save-shapes FILE` writes them as JSON for `throughput_bench.py --decode-matmul-shapes`.

Run on the device: python3 bench/gpu/gemm_bench.py [--batches 64,256] [--autotune] [--triton]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_common import import_engine, measure_ceilings, print_table, time_median

import_engine()  # the device machine runs this from the checkout, not installed
from kvfleet.services.engine.model.decode_matmul_kernel import (  # noqa: E402
    MatmulShape,
    decode_matmul,
    fits,
)

# The 8b shape (Llama-3.1-8B): hidden 4096, 32 query and 8 KV heads of 128, MLP 14336.
HIDDEN, Q, KV, MLP, VOCAB = 4096, 32 * 128, 8 * 128, 14336, 128256
# (name, output rows of each packed part, input width): one layer's matmuls, and the head's.
LAYER = [
    ("qkv", (Q, KV, KV), HIDDEN),
    ("o", (HIDDEN,), Q),
    ("gate_up", (MLP, MLP), HIDDEN),
    ("down", (HIDDEN,), MLP),
]
HEAD = ("lm_head", (VOCAB,), HIDDEN)
# gate/up with its activation in the kernel (cuBLAS's column: the bare matmul, no activation)
GATED = ("gate_up+silu", (MLP, MLP), HIDDEN)
POOL_BYTES = 512 << 20
# The decode kernel's tilings swept by --triton: columns and inner elements per program step,
# inner splits, pipeline stages (4 warps: the weight tile is the only large operand).
SWEEP = [MatmulShape(block_n=n, block_k=k, split_k=split, num_stages=stages)
         for n, k, split, stages in itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8),
                                                      (3, 5))]  # fmt: skip


def graphed_cycle(call, weights: list[torch.Tensor]):
    """One CUDA graph of `call(w)` for every weight copy; returns (replay, calls per replay)."""
    call(weights[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            call(w)
    return graph.replay, len(weights)


def copies(rows: int, cols: int, device) -> list[torch.Tensor]:
    count = max(2, -(-POOL_BYTES // (rows * cols * 2)))
    return [torch.randn(rows, cols, device=device, dtype=torch.bfloat16) for _ in range(count)]


def time_matmul(x: torch.Tensor, rows: int, device, linear=F.linear) -> float:
    """Seconds of one `linear(x, W)` with W `[rows, x.shape[1]]` read from HBM."""
    replay, calls = graphed_cycle(lambda w: linear(x, w), copies(rows, x.shape[1], device))
    return time_median(replay, device, warmup=2, reps=7) / calls


def sweep_decode_kernel(batch: int, device, bandwidth: float) -> tuple[list, dict]:
    """The best tiling of every shape at `batch` rows: (table rows, {(cols, inner): shape})."""
    rows, best_shapes = [], {}
    for name, parts, width in [GATED, *LAYER, HEAD]:
        cols, gated = sum(parts), name == GATED[0]
        x = torch.randn(batch, width, device=device, dtype=torch.bfloat16)
        cublas = time_matmul(x, cols, device)
        best, best_s = None, float("inf")
        for shape in SWEEP:
            if not fits(shape, cols // 2 if gated else cols, width):
                continue
            try:
                seconds = time_matmul(
                    x, cols, device,
                    lambda a, w, s=shape, g=gated: decode_matmul(a, w, None, s, silu_gated=g),
                )  # fmt: skip
            except Exception as exc:  # a tiling that does not build here (shared memory)
                print(f"{name} {shape}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            if seconds < best_s:
                best, best_s = shape, seconds
        weight = cols * width * 2
        if not gated:  # the gated call takes the packed matmul's tiling
            best_shapes[(cols, width)] = best
        rows.append([batch, name, cols, width, cublas * 1e6, weight / cublas / bandwidth,
                     best_s * 1e6, weight / best_s / bandwidth, best.block_n, best.block_k,
                     best.split_k, best.num_stages])  # fmt: skip
        print(rows[-1], flush=True)
    return rows, best_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--autotune", action="store_true", help="inductor max-autotune too")
    parser.add_argument("--triton", action="store_true", help="sweep the decode matmul kernel")
    parser.add_argument("--save-shapes", default="", help="JSON of the best tilings (--triton)")
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth, _ = measure_ceilings(device, small=False)
    print(f"copy bandwidth {bandwidth / 1e12:.3f} TB/s ({torch.cuda.get_device_name()})")
    tuned = None
    if args.autotune:
        tuned = torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        layer_separate = layer_packed = 0.0
        for name, parts, width in [*LAYER, HEAD]:
            x = torch.randn(batch, width, device=device, dtype=torch.bfloat16)
            separate = sum(time_matmul(x, part, device) for part in parts)
            packed = time_matmul(x, sum(parts), device)
            before = torch.backends.cuda.preferred_blas_library()
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = time_matmul(x, sum(parts), device)
            torch.backends.cuda.preferred_blas_library(before)
            weight = sum(parts) * width * 2
            shares = [weight / t / bandwidth for t in (separate, packed, lt)]
            row = [batch, name, "x".join(map(str, parts)), width, separate * 1e6, shares[0],
                   packed * 1e6, shares[1], lt * 1e6, shares[2]]  # fmt: skip
            if tuned is not None:
                try:
                    best = time_matmul(x, sum(parts), device, tuned)
                    row += [best * 1e6, weight / best / bandwidth]
                except Exception as exc:  # a template that does not build here: say so
                    print(f"{name} b{batch} autotune: {type(exc).__name__}: {exc}")
                    row += ["-", "-"]
            rows.append(row)
            print(rows[-1], flush=True)
            if name != HEAD[0]:
                layer_separate += separate
                layer_packed += packed
        floor = sum(sum(p) * w * 2 for _, p, w in LAYER) / bandwidth
        print(f"batch {batch}: one layer's matmuls {layer_separate * 1e6:.1f} us separate, "
              f"{layer_packed * 1e6:.1f} us packed, floor {floor * 1e6:.1f} us "
              f"(x32 layers: {layer_separate * 32e3:.2f} / {layer_packed * 32e3:.2f} / "
              f"{floor * 32e3:.2f} ms)")  # fmt: skip
    header = ["batch", "matmul", "out rows", "in", "separate us", "share", "packed us", "share",
              "cuBLASLt us", "share"]  # fmt: skip
    if tuned is not None:
        header += ["max-autotune us", "share"]
    print_table("8b matmuls at decode: weight bytes over time, share of copy BW", header, rows)
    if not args.triton:
        return
    swept, saved = [], {}
    for batch in (int(b) for b in args.batches.split(",") if int(b) <= 64):
        table, shapes = sweep_decode_kernel(batch, device, bandwidth)
        swept += table
        saved.update(shapes)  # the last batch's pick (the largest: the decode graphs' full one)
        layer = sum(r[6] for r in table if r[1] not in (HEAD[0], GATED[0]))
        floor = sum(sum(p) * w * 2 for _, p, w in LAYER) / bandwidth
        print(f"batch {batch}: one layer's matmuls on the decode kernel {layer:.1f} us "
              f"(floor {floor * 1e6:.1f} us)")  # fmt: skip
    print_table(
        "the decode matmul kernel's best tiling against cuBLAS (packed shapes)",
        ["batch", "matmul", "cols", "inner", "cuBLAS us", "share", "kernel us", "share",
         "block n", "block k", "split k", "stages"],
        swept,
    )  # fmt: skip
    if args.save_shapes:
        with open(args.save_shapes, "w") as out:
            json.dump([{"cols": c, "inner": i, **vars(shape)} for (c, i), shape in saved.items()],
                      out, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
