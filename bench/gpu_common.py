"""Shared pieces of the GPU benchmarks: importing kvfleet without installing it, timing, ceilings.

The device machine has its own torch and no `pip install -e`, so `import_engine()` maps the
repo's `services/`, `kvstore/` and `proto/` folders to `kvfleet.*` through a temporary
package folder.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parent.parent


def import_engine() -> SimpleNamespace:
    """The engine's compute pieces these benchmarks call, from kvfleet installed or straight
    from this checkout (`engine.make_backend`, `engine.ForwardBatch`, ...)."""
    try:
        import kvfleet.services.engine  # noqa: F401
    except ImportError:
        shim = Path(tempfile.mkdtemp(prefix="kvfleet-shim-")) / "kvfleet"
        shim.mkdir()
        for folder in ("services", "kvstore", "proto"):
            (shim / folder).symlink_to(REPO / folder)
        sys.path.insert(0, str(shim.parent))
    from kvfleet.services.engine.attention.backends import available_backends, make_backend
    from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
    from kvfleet.services.engine.compute.generation import default_dtype, generate
    from kvfleet.services.engine.config.model_config import ModelConfig, preset
    from kvfleet.services.engine.kv.kv_cache import PagedKVCache
    from kvfleet.services.engine.model.weights import build_model, load_checkpoint
    from kvfleet.services.engine.request.sampling_params import SamplingParams

    return SimpleNamespace(
        available_backends=available_backends,
        make_backend=make_backend,
        ForwardBatch=ForwardBatch,
        SequenceChunk=SequenceChunk,
        default_dtype=default_dtype,
        generate=generate,
        ModelConfig=ModelConfig,
        preset=preset,
        PagedKVCache=PagedKVCache,
        build_model=build_model,
        load_checkpoint=load_checkpoint,
        SamplingParams=SamplingParams,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_median(
    fn: Callable[[], object], device: torch.device, warmup: int = 2, reps: int = 5
) -> float:
    """Median seconds of `fn()` after `warmup` untimed calls (CUDA events on GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(device: torch.device, small: bool) -> tuple[float, float]:
    """(memory bytes/s of a device copy counting read + write, bf16 matmul FLOP/s) measured now."""
    n = (1 << 20) if small else (1 << 30)
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t_copy = time_median(lambda: dst.copy_(src), device, warmup=3, reps=10)
    bandwidth = 2 * src.numel() * src.element_size() / t_copy
    size = 512 if small else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    t_mm = time_median(lambda: a @ b, device, warmup=3, reps=10)
    return bandwidth, 2 * size**3 / t_mm


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    """A plain fixed-width table."""
    cells = [header, *[[_fmt(c) for c in row] for row in rows]]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    print(f"\n## {title}")
    for i, row in enumerate(cells):
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.4g}"
        return f"{value:.3e}"
    return str(value)
