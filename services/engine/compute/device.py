"""Which device a rank computes on: `auto` picks CUDA when torch sees a GPU, else the CPU.

A rank that was given a GPU (the pod's `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES`, or
`device: cuda`) but finds none still starts, on the CPU, with a WARNING that says what was asked
for and what torch saw: a GPU pod computing on CPU is otherwise only visible as slow tokens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

import torch

log = logging.getLogger(__name__)

GPU_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
# Values of GPU_ENV that hide every GPU (the NVIDIA container runtime's "void" / "none").
NO_GPU_VALUES = ("", "-1", "none", "void")


def gpu_requests(requested: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What asked this rank for a GPU: the device setting and the GPU variables that name one."""
    asked = {name: environ[name] for name in GPU_ENV if name in environ}
    asked = {name: value for name, value in asked.items() if value.strip() not in NO_GPU_VALUES}
    if requested != "auto" and torch.device(requested).type == "cuda":
        asked["device"] = requested
    return asked


def resolve_device(
    requested: str,
    environ: Mapping[str, str] | None = None,
    cuda_available: Callable[[], bool] = torch.cuda.is_available,
    device_count: Callable[[], int] = torch.cuda.device_count,
) -> torch.device:
    """The device for `requested` (auto, cpu, cuda, cuda:N); warns when a GPU was asked for but
    torch sees none (the rank then computes on the CPU)."""
    environ = os.environ if environ is None else environ
    if requested != "auto":
        try:
            wanted = torch.device(requested)
        except RuntimeError as error:
            raise ValueError(f"device: {requested!r} is not a device ({error})") from None
        if wanted.type not in ("cpu", "cuda"):
            raise ValueError(f"device: {requested!r} must be auto, cpu, cuda or cuda:N")
        if wanted.type == "cpu":
            return wanted
    if cuda_available():
        return torch.device("cuda" if requested == "auto" else requested)
    asked = gpu_requests(requested, environ)
    if asked:
        settings = ", ".join(f"{name}={value!r}" for name, value in asked.items())
        log.warning(
            "GPU requested (%s) but torch sees %d CUDA devices (torch %s, built for CUDA %s): "
            "this rank computes on the CPU",
            settings,
            device_count(),
            torch.__version__,
            torch.version.cuda,
        )
    return torch.device("cpu")
