"""Which kernel a projection's matmul runs: cuBLAS, or at decode sizes the Triton kernel of
`decode_matmul_kernel.py` where it is switched on.

`linear(x, w, bias)` is `F.linear` unless the switch is on and the call is one the kernel takes:
at most `MAX_ROWS` rows, bf16/fp16, on CUDA (or any device under Triton's interpreter, for the
tests), and a weight the chosen tiling divides. Every other call (prefill, CPU, fp32, odd
shapes) is cuBLAS's as before. `Linear` is `nn.Linear` with that forward, so the checkpoint
names stay.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config.triton_device import multiprocessors, triton_runs_on

log = logging.getLogger(__name__)

_state = {"on": False, "silu_gated": True}
# (cols, inner) -> tiling measured best for that weight (bench/gpu/gemm_bench.py --triton).
_measured: dict[tuple[int, int], object] = {}
_refused: set[tuple] = set()  # (cols, inner, gated, device) the device could not build
MAX_ROWS = 64  # more rows read the weight often enough for cuBLAS's tiles to pay


def enable(on: bool, silu_gated: bool = True) -> None:
    """Route decode-sized matmuls to the Triton kernel (True) or leave them all to cuBLAS;
    `silu_gated`: with it on, the packed gate/up matmul also applies the activation."""
    _state["on"] = on
    _state["silu_gated"] = silu_gated


@functools.cache
def _kernel(device_type: str) -> tuple[Callable, Callable, type] | None:
    """(decode_matmul, fits, MatmulShape) for tensors on `device_type`; None where the kernel
    cannot run (no Triton, or a CPU without the interpreter)."""
    if not triton_runs_on(device_type):
        return None
    try:
        from .decode_matmul_kernel import MatmulShape, decode_matmul, fits
    except ImportError:
        return None
    return decode_matmul, fits, MatmulShape


def use_shapes(shapes: dict[tuple[int, int], object]) -> None:
    """Tilings measured for weights `(cols, inner)` (MatmulShape each), over `shape_for`'s rule."""
    _measured.clear()
    _measured.update(shapes)
    shape_for.cache_clear()


@functools.cache
def shape_for(cols: int, inner: int, device: torch.device):
    """The tiling of a weight `[cols, inner]`: a measured one where there is one, else the
    picks of the tiling sweep at 64 rows on an H100 (bench/gpu/gemm_bench.py --triton, the 8b's
    five shapes), as a rule: 64 columns a program and 128 inner elements a step; 128 columns
    where there would be 8 programs a multiprocessor or more (the LM head); the inner
    dimension split in two only where it is long (8k or more) and the column blocks leave
    multiprocessors idle; 3 pipeline stages for the wide shapes, 5 for the narrow. None where
    no tiling divides `inner`."""
    kernel = _kernel(device.type)
    if kernel is None:
        return None
    _, fits, MatmulShape = kernel
    measured = _measured.get((cols, inner))
    if measured is not None and fits(measured, cols, inner):
        return measured
    sms, blocks = multiprocessors(device), -(-cols // 64)
    wide = blocks >= 8 * sms
    shape = MatmulShape(
        block_n=128 if wide else 64,
        block_k=128,
        split_k=2 if blocks < sms and inner >= 8192 else 1,
        num_stages=3 if wide or blocks >= 2 * sms else 5,
    )
    if fits(shape, cols, inner):
        return shape
    shape = MatmulShape(block_n=shape.block_n, block_k=128, num_stages=shape.num_stages)
    return shape if fits(shape, cols, inner) else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the decode kernel where it is on and takes the call."""
    if not _state["on"] or not _takes(x, weight):
        return F.linear(x, weight, bias)
    shape = shape_for(weight.shape[0], weight.shape[1], x.device)
    out = None if shape is None else _launch(x, weight, bias, shape, False)
    return F.linear(x, weight, bias) if out is None else out


def silu_gated_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """`silu(gate) * up` of the packed gate/up projection `weight` (gate rows, then up rows) in
    one kernel, where the switch is on and the kernel takes the call; None where it does not
    (the caller runs the matmul and the activation)."""
    if not (_state["on"] and _state["silu_gated"]) or not _takes(x, weight):
        return None
    shape = shape_for(weight.shape[0], weight.shape[1], x.device)
    if shape is None or not _kernel(x.device.type)[1](shape, weight.shape[0] // 2, weight.shape[1]):
        return None
    return _launch(x, weight, bias, shape, True)


def _launch(x, weight, bias, shape, gated: bool) -> torch.Tensor | None:
    """The kernel's result; None, and cuBLAS for this weight from then on, where the device
    cannot build the tiling (Triton's OutOfResources: shared memory, registers), which a decode
    graph's eager warm-up meets before its capture."""
    key = (weight.shape[0], weight.shape[1], gated, x.device)
    if key in _refused:
        return None
    flat = x.reshape(-1, x.shape[-1])
    try:
        out = _kernel(x.device.type)[0](flat, weight, bias, shape, silu_gated=gated)
    except Exception as error:
        from triton.runtime.errors import OutOfResources  # Triton is loaded: the kernel ran

        if not isinstance(error, OutOfResources):
            raise
        log.warning("decode matmul %s: %s; cuBLAS takes this weight", key[:3], error)
        _refused.add(key)
        return None
    return out.view(*x.shape[:-1], out.shape[-1])


def _takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        0 < rows <= MAX_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and weight.stride(-1) == 1
        and _kernel(x.device.type) is not None
    )


class Linear(nn.Linear):
    """`nn.Linear` whose forward is `linear` (the decode kernel where it is on)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
