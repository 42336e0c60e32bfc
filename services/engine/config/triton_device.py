"""What the engine's Triton kernels ask of a device: whether a kernel can run on it, and how
many multiprocessors it has to fill.

The dispatch modules (attention, model, kv) import their kernel modules, and so Triton, only
when a call first needs one, after asking `triton_runs_on`.
"""

from __future__ import annotations

import functools
import os

import torch

INTERPRETER_MULTIPROCESSORS = 4  # a CPU under Triton's interpreter (tests) tiles as a small GPU


def triton_runs_on(device_type: str) -> bool:
    """CUDA, or any device under Triton's interpreter (`TRITON_INTERPRET=1`, set before Triton
    is imported: tests only)."""
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (a CUDA device's; a small stand-in elsewhere)."""
    if device.type != "cuda":
        return INTERPRETER_MULTIPROCESSORS
    return torch.cuda.get_device_properties(device).multi_processor_count
