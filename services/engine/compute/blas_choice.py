"""The BLAS library a forward's matmuls run in: cuBLASLt for a few rows, cuBLAS otherwise.

A decode step multiplies each weight by a few rows, and reads the whole weight to do so. On an
H200, at 64 rows of the 8b shape (`bench/gpu/gemm_bench.py`), cuBLASLt's kernels read the
down projection at 0.86 of copy bandwidth where cuBLAS's read 0.77, and gate/up at 0.90 against
0.86; at 256 rows and at prefill sizes they are equal or slower (gate/up at 8,192 rows: 3.2 ms
against 2.8). The choice is made per forward, from its row count, for the eager step and the
captured decode graphs alike, so that both run the same kernels and agree token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

LT_MAX_ROWS = 64  # the largest row count measured faster in cuBLASLt


@contextmanager
def blas_for_rows(rows: int, device: torch.device) -> Iterator[None]:
    """Run the enclosed forward's matmuls in cuBLASLt when it has at most LT_MAX_ROWS rows
    on CUDA; elsewhere (CPU, larger forwards) change nothing."""
    if device.type != "cuda" or rows > LT_MAX_ROWS:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)
