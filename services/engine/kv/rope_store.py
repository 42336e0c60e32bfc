"""Whether a layer's RoPE and KV write run as one kernel (rope_store_kernel.py), and the call.

`rotate_and_write` returns the rotated queries after storing the rotated keys and the values,
or None where the kernel does not take the call, and the caller rotates and writes as before:
the switch off, no Triton (or a CPU without its interpreter), an fp8 cache, partial rotary, or
a head size whose half is not a power of two.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..config.triton_device import triton_runs_on

_state = {"on": False}


def enable(on: bool) -> None:
    """Rotate and write K/V in one kernel where it takes the call (True), or never."""
    _state["on"] = on


def enabled() -> bool:
    return _state["on"]


@functools.cache
def _kernel(device_type: str) -> Callable | None:
    if not triton_runs_on(device_type):
        return None
    try:
        from .rope_store_kernel import rope_store
    except ImportError:
        return None
    return rope_store


def rotate_and_write(
    pages: torch.Tensor,
    qkv: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    slots: torch.Tensor,
    valid: torch.Tensor | None,
    heads: int,
) -> torch.Tensor | None:
    """Rotated q `[T, heads, D]` of the packed `qkv [T, (heads + 2 * kv_heads) * D]`, its
    rotated k and its v stored at `slots` of one layer's `pages [2, slots, kv_heads, D]`; None
    where the kernel does not take the call (nothing is written then)."""
    head_dim = pages.shape[-1]
    half = head_dim // 2
    takes = (
        _state["on"]
        and pages.dtype == qkv.dtype
        and pages.dtype in (torch.bfloat16, torch.float16)
        and rope[0].shape[-1] == half
        and half & (half - 1) == 0
        and qkv.stride(-1) == 1
        and _kernel(qkv.device.type) is not None
    )
    if not takes:
        return None
    return _kernel(qkv.device.type)(qkv, rope, pages, slots, valid, heads)
