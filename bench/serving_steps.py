"""What the serving benchmarks record per engine step: timing, the step's roofline floor (the
bytes it must read over copy bandwidth, or its FLOPs over the matmul rate, whichever is
larger) and, for a few steps, kernel launches from a torch.profiler trace."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def qwen3_0_6b_shape():
    """Qwen3-0.6B's shape (per-head q/k norms, tied embeddings); random weights."""
    from kvfleet.services.engine.config.model_config import ModelConfig

    return ModelConfig(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_embeddings=True,
        qk_norm=True,
        name="qwen3-0.6b",
    )


@dataclass
class Step:
    started: float
    ended: float
    sequences: int
    tokens: int
    decode: bool  # one new token per sequence
    floor: float  # seconds the step needs at least


class StepRecorder:
    """Wraps a compute backend's `launch` and keeps one `Step` per engine step."""

    def __init__(self, model, dtype_bytes: int, bandwidth: float, peak: float) -> None:
        h, vocab = model.hidden_size, model.vocab_size
        embed = vocab * h
        # The input embedding is gathered, not streamed; the LM head is streamed once.
        self.weight_bytes = (model.num_parameters() - (0 if model.tie_embeddings else embed)) * (
            dtype_bytes
        )
        self.matmul_params = model.num_parameters() - embed * (1 if model.tie_embeddings else 2)
        self.head_params = embed
        self.kv_bytes = model.num_layers * 2 * model.num_kv_heads * model.head_dim * dtype_bytes
        self.attn_flops_per_pair = model.num_layers * 4 * model.num_heads * model.head_dim
        self.bandwidth, self.peak = bandwidth, peak
        self.steps: list[Step] = []
        self.launches: tuple[object, object] = ("-", "-")
        self.kernels: dict = {}  # count_launches' device-time summary of the profiled steps
        self.timed_until = 0  # steps before the profiled ones
        self._original = None

    def attach(self, compute) -> None:
        """Time each step from its launch to its tokens on the host."""
        self.steps = []
        self._original = compute.launch

        def launch(chunks, *feed):
            started = time.perf_counter()
            finish = self._original(chunks, *feed)

            def timed_finish():
                tokens = finish()
                self.steps.append(self._step(chunks, started, time.perf_counter()))
                return tokens

            # The core plans the next step ahead only from a step whose tokens are on the device.
            timed_finish.device_tokens = getattr(finish, "device_tokens", None)
            return timed_finish

        compute.launch = launch

    def detach(self, compute) -> None:
        del compute.launch  # back to the class's method

    def _step(self, chunks, started: float, ended: float) -> Step:
        tokens = sum(len(c.new_tokens) for c in chunks)
        context = sum(c.start + len(c.new_tokens) for c in chunks)
        pairs = sum(
            len(c.new_tokens) * c.start + len(c.new_tokens) * (len(c.new_tokens) + 1) // 2
            for c in chunks
        )
        nbytes = self.weight_bytes + context * self.kv_bytes
        flops = 2 * self.matmul_params * tokens + 2 * self.head_params * len(chunks)
        flops += self.attn_flops_per_pair * pairs
        floor = max(nbytes / self.bandwidth, flops / self.peak)
        decode = tokens == len(chunks)
        return Step(started, ended, len(chunks), tokens, decode, floor)

    def decode_window(self, batch: int, steps: list[Step], skip_first: int = 2) -> list[Step]:
        """The full-batch decode steps among `steps`, less the first few (graph capture)."""
        full = [s for s in steps if s.decode and s.sequences == batch]
        return full[skip_first:]

    def window_rate(self, steps: list[Step]) -> tuple[float, float, float, float]:
        """Over consecutive steps: tokens/s from step start to step start, floor / measured,
        and the mean ms per step from launch to tokens on the host (forward, sampling, and the
        commits that overlap them) and outside it (the scheduler, kvstore calls and outputs)."""
        if len(steps) < 2:
            return (float("nan"),) * 4
        elapsed = steps[-1].started - steps[0].started
        tokens = sum(s.tokens for s in steps[:-1])
        inside = sum(s.ended - s.started for s in steps[:-1]) / (len(steps) - 1)
        outside = elapsed / (len(steps) - 1) - inside
        floor = sum(s.floor for s in steps[:-1])
        return tokens / elapsed, floor / elapsed, inside * 1e3, outside * 1e3

    def floor_seconds(self) -> float:
        return sum(s.floor for s in self.steps)


ATTENTION_KERNELS = ("flash", "fmha", "attention", "_partial_kernel", "_merge_kernel")
MATMUL_KERNELS = ("gemm", "nvjet", "cutlass", "xmma", "splitk", "_matmul_kernel")


def kernel_kind(name: str) -> str:
    """attention, matmul or other, from a device kernel's name."""
    lower = name.lower()
    if any(word in lower for word in ATTENTION_KERNELS):
        return "attention"
    if any(word in lower for word in MATMUL_KERNELS):
        return "matmul"
    return "other"


def count_launches(step_fn, steps: int, kernels: dict | None = None) -> tuple[object, object]:
    """(host kernel/graph launches per step, device kernels per step) over `steps` calls of
    `step_fn` under torch.profiler; ("-", "-") without CUDA. `kernels`, when given, receives
    ms per step: the device busy (kernels' union), the span from first kernel to last, each
    kind's kernels (`kernel_kind`), the top 5 kernels by name, the top 12 "other" kernels, and
    each kernel's calls per step."""
    if not torch.cuda.is_available():
        for _ in range(steps):
            step_fn()
        return "-", "-"
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step_fn()
        torch.cuda.synchronize()
    host = device = 0
    spans: list[tuple[float, float]] = []
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in prof.events():
        name = event.name
        if name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")):
            host += 1
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            device += 1
            start, end = event.time_range.start, event.time_range.end
            spans.append((start, end))
            kind = kernel_kind(name)
            by_kind[kind] = by_kind.get(kind, 0.0) + end - start
            by_name[name] = by_name.get(name, 0.0) + end - start
            calls[name] = calls.get(name, 0) + 1
    if kernels is not None and spans:
        kernels.update(_kernel_summary(spans, by_kind, by_name, steps))
        kernels["calls"] = {name: count / steps for name, count in calls.items()}
    return round(host / steps), round(device / steps)


def _kernel_summary(spans, by_kind, by_name, steps) -> dict:
    """ms per step from profiler microseconds: busy (merged kernel intervals), span, kinds."""
    spans.sort()
    busy, (run_start, run_end) = 0.0, spans[0]
    for start, end in spans[1:]:
        if start > run_end:
            busy += run_end - run_start
            run_start, run_end = start, end
        else:
            run_end = max(run_end, end)
    busy += run_end - run_start
    top = sorted(by_name.items(), key=lambda item: -item[1])[:5]
    others = sorted(((n, us) for n, us in by_name.items() if kernel_kind(n) == "other"),
                    key=lambda item: -item[1])[:12]  # fmt: skip
    per_step = 1e-3 / steps
    return {
        "other_top": [(name, us * per_step) for name, us in others],
        "busy": busy * per_step,
        "span": (max(end for _, end in spans) - spans[0][0]) * per_step,
        **{kind: us * per_step for kind, us in by_kind.items()},
        "top": [(name[:60], us * per_step) for name, us in top],
    }
