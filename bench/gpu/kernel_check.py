"""The Triton decode matmul against fp32 math and cuBLAS on the device, at the 8b's shapes.

For each shape and row count: the relative error (max |got - fp32| / max |fp32|) of the kernel
and of cuBLAS, and whether 20 calls in a row give the same bits (the split-K arrival counters
and the part-ordered sum make the kernel deterministic). Gated: silu(gate) * up against fp32.

Run on the device: python3 bench/gpu/kernel_check.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_common import import_engine, print_table

import_engine()  # the device machine runs this from the checkout, not installed
from gemm_bench import GATED, HEAD, LAYER  # noqa: E402
from kvfleet.services.engine.model import decode_matmul  # noqa: E402
from kvfleet.services.engine.model.decode_matmul_kernel import (  # noqa: E402
    decode_matmul as kernel,
)


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def main() -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    rows_out = []
    for name, parts, width in [*LAYER, GATED, HEAD]:
        cols, gated = sum(parts), name == GATED[0]
        w = (torch.randn(cols, width, device=device, generator=gen) * 0.02).to(torch.bfloat16)
        shape = decode_matmul.shape_for(cols, width, device)
        for rows in (1, 24, 64):
            x = torch.randn(rows, width, device=device, generator=gen).to(torch.bfloat16)
            exact = x.float() @ w.float().T
            cublas = F.linear(x, w)
            if gated:
                gate, up = exact.chunk(2, -1)
                exact = F.silu(gate) * up
                g, u = cublas.chunk(2, -1)
                cublas = F.silu(g.float()) * u.float()
            got = kernel(x, w, None, shape, silu_gated=gated)
            same = all(torch.equal(got, kernel(x, w, None, shape, silu_gated=gated))
                       for _ in range(20))  # fmt: skip
            rows_out.append([name, rows, str(shape), relative(got, exact),
                             relative(cublas, exact), same])  # fmt: skip
            print(rows_out[-1], flush=True)
    print_table("decode matmul kernel vs fp32 (relative max error)",
                ["matmul", "rows", "tiling", "kernel", "cuBLAS", "20 calls same bits"],
                rows_out)  # fmt: skip


if __name__ == "__main__":
    main()
