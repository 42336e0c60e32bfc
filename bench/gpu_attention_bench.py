"""Paged attention on the GPU: correctness of every backend against the fp32 reference, and
kernel speed (prefill TFLOP/s against the matmul peak, decode KV-read bandwidth against the
copy bandwidth, flash-attn against SDPA), all in one run. Called by gpu_engine_bench.py."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import torch
from gpu_common import print_table, sync, time_median


@dataclass(frozen=True)
class Shape:
    """Attention heads of a model shape."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int


SHAPE_8B = Shape("8b", 32, 8, 128)
SHAPE_1B = Shape("1b", 32, 8, 64)


def random_paged(engine, spec, shape, page_size, window, device, dtype, seed=0):
    """(cache, batch, q) for sequences `spec = [(num_cached, num_new), ...]` on shuffled pages."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    config = engine.ModelConfig(
        vocab_size=16,
        hidden_size=shape.heads * shape.head_dim,
        intermediate_size=16,
        num_layers=1,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position=1 << 20,
        window_layers=(0,) if window else (),
        window_size=window or 0,
    )
    per_seq = [math.ceil((c + n) / page_size) for c, n in spec]
    cache = engine.PagedKVCache(config, sum(per_seq) + 1, page_size, device, dtype)
    k_pages, v_pages = cache.kv(0)
    k_pages.normal_(generator=None)
    v_pages.normal_()
    k_pages[0].zero_()
    v_pages[0].zero_()
    order = (torch.randperm(sum(per_seq), generator=gen) + 1).tolist()
    group = next(iter(cache.num_pages))
    chunks, start = [], 0
    for (cached, new), count in zip(spec, per_seq, strict=True):
        pages = order[start : start + count]
        start += count
        if window:
            first_read = max(0, cached - window + 1) // page_size
            pages = [0] * first_read + pages[first_read:]
        chunks.append(engine.SequenceChunk([0] * new, cached, {group: pages}))
    batch = engine.ForwardBatch.build(chunks, cache)
    q = torch.randn(
        int(batch.token_ids.numel()), shape.heads, shape.head_dim, device=device, dtype=dtype
    )
    return cache, batch.attention[group], q


def attention_flops(spec, shape, window) -> float:
    """4 * heads * head_dim * (query, key) pairs actually attended."""
    pairs = 0
    for cached, new in spec:
        for p in range(cached, cached + new):
            pairs += min(p + 1, window) if window else p + 1
    return 4.0 * shape.heads * shape.head_dim * pairs


def kv_bytes(spec, shape, itemsize) -> float:
    """Bytes of K and V each query sequence must read once."""
    return float(sum(c + n for c, n in spec) * shape.kv_heads * shape.head_dim * 2 * itemsize)


CORRECTNESS_CASES = {
    "prefill": ([(0, 300), (0, 1000)], None),
    "chunked prefill": ([(1000, 512), (4000, 100), (257, 33)], None),
    "decode": ([(c, 1) for c in (100, 777, 1500, 2048, 3000, 5000, 64, 1)], None),
    "mixed": ([(3000, 1), (1000, 512), (0, 700), (129, 1)], None),
    "window mixed": ([(3000, 1), (1000, 512), (0, 700), (129, 1)], 256),
}


# (shape, page size): page 128 is flash-attn's TMA path (a page is one key tile), 16 the other.
CORRECTNESS_LAYOUTS = ((SHAPE_8B, 128), (SHAPE_8B, 16), (SHAPE_1B, 128))


def check_correctness(engine, device, backends, layouts=CORRECTNESS_LAYOUTS):
    """Max relative error of each backend against the fp32 reference; raises if over 2e-2."""
    reference = engine.make_backend("reference", device)
    columns = [*backends, *(["flash kv_splits=3"] if "flash" in backends else [])]
    rows, worst = [], 0.0
    for shape, page_size in layouts:
        for case, (spec, window) in CORRECTNESS_CASES.items():
            cache, meta, q = random_paged(
                engine, spec, shape, page_size, window, device, torch.bfloat16
            )
            k, v = cache.kv(0)
            scale = shape.head_dim**-0.5
            ref = reference.forward(q.float(), k.float(), v.float(), meta, window, scale)
            row = [shape.name, page_size, case]
            for label in columns:
                name, _, splits = label.partition(" kv_splits=")
                options = {"kv_splits": int(splits)} if splits else {}
                backend = engine.make_backend(name, device, **options)
                out = backend.forward(q, k, v, meta, window, scale)
                err = float((out.float() - ref).norm() / ref.norm())
                err = err if math.isfinite(err) else float("inf")
                worst = max(worst, err)
                row.append(err)
            rows.append(row)
    print_table(
        "paged attention vs fp32 reference (relative error, bf16)",
        ["shape", "page", "case", *columns],
        rows,
    )
    if worst > 2e-2:
        raise AssertionError(f"paged attention error {worst:.3g} > 2e-2")
    return worst


def prefill_perf(engine, device, peak_flops, backends, small):
    """TFLOP/s and MFU of dense and chunked prefill through each backend, plus raw SDPA."""
    n = 2048 if small else 32768
    cases = {
        f"prefill {n // 1024}k": [(0, n)],
        "chunked 4x512 over 16k": [(16384 if not small else 1024, 512)] * 4,
        f"window 4k, prefill {n // 1024}k": [(0, n)],
    }
    rows = []
    for case, spec in cases.items():
        window = 4096 if case.startswith("window") else None
        cache, meta, q = random_paged(engine, spec, SHAPE_8B, 128, window, device, torch.bfloat16)
        k, v = cache.kv(0)
        flops = attention_flops(spec, SHAPE_8B, window)
        for name in backends:
            backend = engine.make_backend(name, device)
            t = time_median(partial(backend.forward, q, k, v, meta, window, 128**-0.5), device)
            rows.append([case, name, t * 1e3, flops / t / 1e12, flops / t / peak_flops])
    rows.append(_raw_sdpa_row(n, device, peak_flops))
    print_table(
        f"prefill attention, 8b heads (32q/8kv x 128), page 128; "
        f"matmul peak {peak_flops / 1e12:.0f} TFLOP/s",
        ["case", "backend", "ms", "TFLOP/s", "MFU"],
        rows,
    )
    return rows


def _raw_sdpa_row(n, device, peak_flops):
    """SDPA on contiguous K/V with is_causal: what PyTorch does with no paging at all."""
    q = torch.randn(1, 32, n, 128, device=device, dtype=torch.bfloat16)
    k = torch.randn(1, 32, n, 128, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    t = time_median(lambda: sdpa(q, k, v, is_causal=True), device)
    flops = attention_flops([(0, n)], SHAPE_8B, None)
    return [
        f"prefill {n // 1024}k",
        "sdpa kernel, contiguous",
        t * 1e3,
        flops / t / 1e12,
        flops / t / peak_flops,
    ]


def decode_perf(engine, device, bandwidth, backends, small, batches=None, shape=SHAPE_8B):
    """KV-read bandwidth of decode for flash split settings and for SDPA, per batch size."""
    ctx = 1024 if small else 8192
    batches = batches or ((32,) if small else (32, 64, 128))
    rows = []
    for batch in batches:
        spec = [(ctx - 1 + (i % 7) * 16, 1) for i in range(batch)]
        cache, meta, q = random_paged(engine, spec, shape, 128, None, device, torch.bfloat16)
        k, v = cache.kv(0)
        nbytes = kv_bytes(spec, shape, 2)
        variants = [("sdpa", {})] if "sdpa" in backends and batch == 32 else []
        if "flash" in backends:
            variants += [("flash", {"kv_splits": s}) for s in (1, 0, 2, 4, 8)]
            variants += [("flash", {"kv_splits": 1, "pack_gqa": False})]
        if not variants:
            variants = [(backends[0], {})]
        for name, options in variants:
            backend = engine.make_backend(name, device, **options)
            call = partial(backend.forward, q, k, v, meta, None, shape.head_dim**-0.5)
            t = time_median(call, device, reps=10)
            host = _host_seconds(call, device)
            fraction = nbytes / t / bandwidth
            label = name + "".join(f" {key}={val}" for key, val in options.items())
            rows.append(
                [shape.name, batch, ctx, label, t * 1e6, host * 1e6, nbytes / t / 1e12, fraction]
            )
        if "flash" in backends and batch <= 64:
            for splits in (1, 0):
                rows.append(
                    _graph_row(engine, device, (q, k, v, meta), shape, nbytes, bandwidth, splits)
                )
    best = max((row[-1] for row in rows if str(row[3]).startswith("flash")), default=0.0)
    print_table(
        f"decode attention KV read, copy bandwidth {bandwidth / 1e12:.2f} TB/s "
        "(kv_splits=1: default, 0: auto)",
        ["shape", "batch", "ctx", "backend", "GPU us", "host us", "TB/s", "of copy BW"],
        rows,
    )
    return best


def _host_seconds(call, device, reps=20) -> float:
    """Host time per call when calls are queued back to back (launch + Python overhead)."""
    call()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    host = (time.perf_counter() - t0) / reps
    sync(device)
    return host


def _graph_row(engine, device, inputs, shape, nbytes, bandwidth, splits):
    """One flash decode call captured in a CUDA graph and replayed (no host overhead)."""
    q, k, v, meta = inputs
    batch, ctx = len(meta.query_lens), meta.max_seqlen_k
    label = f"flash kv_splits={splits}, CUDA graph"
    backend = engine.make_backend("flash", device, kv_splits=splits)
    call = partial(backend.forward, q, k, v, meta, None, shape.head_dim**-0.5)
    try:
        call()
        sync(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        t = time_median(graph.replay, device, reps=10)
        host = _host_seconds(graph.replay, device)
        tbps, fraction = nbytes / t / 1e12, nbytes / t / bandwidth
        return [shape.name, batch, ctx, label, t * 1e6, host * 1e6, tbps, fraction]
    except Exception as exc:  # report, keep benchmarking
        failure = f"{label} failed: {type(exc).__name__}: {str(exc)[:60]}"
        return [shape.name, batch, ctx, failure, 0.0, 0.0, 0.0, 0.0]
