"""Elementwise pieces of the decoder fused into one kernel each by torch.compile, on CUDA only.

A decode step at batch 64 spends a quarter of its GPU time in ~1,000 tiny elementwise kernels
(RMSNorm alone is nine: casts, square, mean, rsqrt, products). `@fusable` marks a function of
plain torch ops; on CUDA tensors, once `enable(True)` was called, it runs as one inductor
kernel compiled for dynamic shapes (per shape where that compile fails), and everywhere else
(CPU, CI, a failed compile) as the very same Python. CUDA-graph capture replays the compiled
kernels like any other launch; the first call of each shape compiles, so decode graphs warm up
eagerly before they capture.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

_state = {"enabled": False}


def enable(on: bool) -> None:
    """Turn fusion on or off for the whole process (the compute backend decides)."""
    _state["enabled"] = on


def enabled() -> bool:
    return _state["enabled"]


def fusable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` itself, compiled into fused kernels when its first tensor argument is on CUDA."""
    compiled: dict[str, Any] = {}

    @functools.wraps(fn)
    def call(first: torch.Tensor, *args: Any) -> Any:
        if not (_state["enabled"] and first.is_cuda) or compiled.get("broken"):
            return fn(first, *args)
        if "fn" not in compiled:
            compiled["fn"] = torch.compile(fn, dynamic=True, fullgraph=True)
        try:
            return compiled["fn"](first, *args)
        except Exception:  # a compiler problem must not stop serving: the eager ops are right
            if not compiled.get("static"):
                # NOTE: inductor's dynamic-shape tiling can fail where static shapes compile
                # (seen on the H200 for the batched SSM step); decode graphs use a few fixed
                # batch sizes, so one kernel per shape costs little.
                log.warning("dynamic torch.compile of %s failed; compiling per shape", fn.__name__)
                compiled["static"] = True
                compiled["fn"] = torch.compile(fn, dynamic=False, fullgraph=True)
                return call(first, *args)
            log.exception("torch.compile of %s failed; running it unfused", fn.__name__)
            compiled["broken"] = True
            return fn(first, *args)

    call.unfused = fn  # the plain function, for tests
    return call
