"""`x @ w.T (+ bias)` for a few rows of `x`: a Triton kernel that streams the weight, CUDA only.

At decode a projection reads its whole weight for a few rows (64 at most here), so it is bound
by how near the copy bandwidth its kernel streams the weight. cuBLAS's kernels for these shapes
leave the GPU part idle where the weight is narrow (an 8b's q/k/v at 0.71 of copy bandwidth,
its o projection at 0.64: docs/engine-gpu.md). Here program (n, s) takes `BLOCK_N` output
columns over one of `SPLIT_K` parts of the inner dimension: the weight tile is the wide operand
of `tl.dot` and the rows the narrow one (padded to 16, the dot's least), so any row count up to
64 runs the same tiling. Split parts write fp32 partial sums; the last part of a column block to
finish (an arrival counter, reset by it for the next call) adds them in part order, so results
do not depend on arrival order. Shapes only decide the grid: a captured CUDA graph replays it.
Gated (`silu_gated`), a program streams a gate tile and its up tile and stores
`silu(gate) * up`: the MLP's activation costs no kernel and no round trip of its own.

On a CPU tensor the kernel runs in Triton's interpreter when `TRITON_INTERPRET=1` was set before
Triton was imported (tests only).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

COUNTERS = 1 << 16  # arrival counters per device: column blocks of one split call at most


@dataclasses.dataclass(frozen=True)
class MatmulShape:
    """One call's tiling (bench/gpu/gemm_bench.py --triton sweeps them; `shape_for` picks)."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _matmul_kernel(
    x,
    w,
    bias,
    y,
    partial,
    counters,
    rows,
    cols,
    inner,
    x_stride,
    w_stride,
    y_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    DOT: tl.constexpr,
):
    block, part = tl.program_id(0), tl.program_id(1)
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    n_ok, m_ok = n < cols, m < rows
    per_part = inner // SPLIT_K  # the caller checks that BLOCK_K * SPLIT_K divides inner
    start = part * per_part
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # GATED: the up half's sums
    for k0 in range(start, start + per_part, BLOCK_K):
        x_tile = tl.load(x + m[None, :] * x_stride + (k0 + k)[:, None], mask=m_ok[None, :])
        w_tile = tl.load(w + n[:, None] * w_stride + (k0 + k)[None, :], mask=n_ok[:, None])
        acc = tl.dot(w_tile.to(DOT), x_tile.to(DOT), acc)
        if GATED:  # the up row of each gate row sits `cols` rows further down the weight
            u_tile = tl.load(w + (n + cols)[:, None] * w_stride + (k0 + k)[None, :],
                             mask=n_ok[:, None])  # fmt: skip
            up = tl.dot(u_tile.to(DOT), x_tile.to(DOT), up)
    if SPLIT_K > 1:
        # partial [SPLIT_K, cols * (2 if GATED else 1), BLOCK_M]: gate sums, then up sums
        halves = 2 if GATED else 1
        ws = partial + (n[:, None] * BLOCK_M + m[None, :])
        tl.store(ws + part * halves * cols * BLOCK_M, acc, mask=n_ok[:, None])
        if GATED:
            tl.store(ws + (part * 2 + 1) * cols * BLOCK_M, up, mask=n_ok[:, None])
        tl.debug_barrier()  # every thread's partial sums are stored before the arrival
        arrived = tl.atomic_add(counters + block, 1, sem="acq_rel")
        last = arrived == SPLIT_K - 1
        if last:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # in part order: the sum is deterministic
                at = ws + s * halves * cols * BLOCK_M
                acc += tl.load(at, mask=n_ok[:, None], cache_modifier=".cg")
                if GATED:
                    up += tl.load(at + cols * BLOCK_M, mask=n_ok[:, None], cache_modifier=".cg")
            tl.store(counters + block, 0)  # ready for the next call (a graph's replay)
    else:
        last = True
    if last:
        if HAS_BIAS:
            acc += tl.load(bias + n, mask=n_ok).to(tl.float32)[:, None]
            if GATED:
                up += tl.load(bias + cols + n, mask=n_ok).to(tl.float32)[:, None]
        if GATED:
            # silu(gate) * up of the halves rounded to the output's dtype, as the unfused path
            # computes it from the packed matmul's output
            gate = acc.to(y.dtype.element_ty).to(tl.float32)
            acc = gate * tl.sigmoid(gate) * up.to(y.dtype.element_ty).to(tl.float32)
        out = y + m[None, :] * y_stride + n[:, None]
        tl.store(out, acc.to(y.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


_DOT_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
_counters: dict[torch.device, torch.Tensor] = {}


def _counters_of(device: torch.device) -> torch.Tensor:
    # NOTE: one zeroed buffer per device for the process's life: a captured graph keeps its
    # address, and each call leaves it zeroed again. Calls on one stream never overlap.
    if device not in _counters:
        _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _counters[device]


def fits(shape: MatmulShape, cols: int, inner: int) -> bool:
    """Whether `shape` tiles a weight `[cols, inner]` (the inner cut evenly into blocks)."""
    blocks = -(-cols // shape.block_n)
    split_ok = shape.split_k == 1 or blocks <= COUNTERS
    return inner % (shape.block_k * shape.split_k) == 0 and split_ok


def stages_within(shape: MatmulShape, block_m: int, halves: int, shared_bytes: int) -> int:
    """The most pipeline stages, up to `shape`'s, whose tiles fit `shared_bytes`: each stage
    keeps `halves` weight tiles and a tile of the rows, 16-bit elements (a gated 64-column
    tiling of 5 stages at 64 rows needs 240 KB, over the H100's and H200's 227 KB)."""
    per_stage = 2 * shape.block_k * (shape.block_n * halves + block_m)
    return max(1, min(shape.num_stages, shared_bytes // per_stage))


@functools.cache
def _fitted(shape: MatmulShape, block_m: int, halves: int, device: torch.device) -> MatmulShape:
    """`shape` with as many stages as the device's shared memory holds (`stages_within`)."""
    if device.type != "cuda":
        return shape
    index = device.index if device.index is not None else torch.cuda.current_device()
    limit = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return dataclasses.replace(shape, num_stages=stages_within(shape, block_m, halves, limit))


def decode_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    shape: MatmulShape,
    silu_gated: bool = False,
) -> torch.Tensor:
    """`x [rows, inner] @ w [cols, inner].T + bias` for rows up to `decode_matmul.MAX_ROWS`, in
    x's dtype (fp32 sums); `fits(shape, cols, inner)` must hold and both must be contiguous in
    inner. `silu_gated`: w (and bias) hold gate rows then as many up rows, and the result is
    `silu(gate) * up`, `[rows, cols / 2]`: the packed gate/up projection and its activation in
    one kernel."""
    rows, inner = x.shape
    halves = 2 if silu_gated else 1  # weight rows per output column
    cols = w.shape[0] // halves
    block_m = max(16, triton.next_power_of_2(rows))
    y = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(cols, shape.block_n)
    shape = _fitted(shape, block_m, halves, x.device)
    partial = counters = y  # unused without a split
    if shape.split_k > 1:
        partial = torch.empty(
            shape.split_k * halves, cols, block_m, dtype=torch.float32, device=x.device
        )
        counters = _counters_of(x.device)
    _matmul_kernel[(blocks, shape.split_k)](
        x,
        w,
        bias if bias is not None else y,
        y,
        partial,
        counters,
        rows,
        cols,
        inner,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=shape.block_n,
        BLOCK_K=shape.block_k,
        SPLIT_K=shape.split_k,
        HAS_BIAS=bias is not None,
        GATED=silu_gated,
        # NOTE: Triton's interpreter has no bf16 arithmetic: fp32 products on the CPU.
        DOT=tl.float32 if x.device.type == "cpu" else _DOT_TYPES[x.dtype],
        num_warps=shape.num_warps,
        num_stages=shape.num_stages,
    )
    return y
