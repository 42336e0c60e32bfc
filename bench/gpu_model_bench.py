"""Whole-model speed on the GPU: prefill and decode tokens/s, a decode step's profile, and
TTFT of a 32k prompt with 0 % and 95 % of it cached. Called by gpu_engine_bench.py."""

from __future__ import annotations

import time

import torch
from gpu_common import sync, time_median


class PageCounter:
    """Hands out fresh page ids 1, 2, 3, ... (page 0 is the null page)."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self.next = 1

    def take(self, tokens: int) -> dict[str, list[int]]:
        count = -(-tokens // self.cache.page_size)
        ids = list(range(self.next, self.next + count))
        self.next += count
        return dict.fromkeys(self.cache.num_pages, ids)


def model_perf(engine, device, name, small, peak, bandwidth, summary) -> None:
    """Append prefill/decode tokens/s and TTFT rows of preset `name` to `summary`."""
    config = engine.preset("tiny" if small else name)
    dtype = engine.default_dtype(device)
    t0 = time.perf_counter()
    model = engine.build_model(config, seed=0, device=device, dtype=dtype)
    sync(device)
    summary.append([f"{name}: init from seed on device, s", time.perf_counter() - t0])
    backend = engine.make_backend(None, device)
    prompt, seqs, seq_len, decode_batch, decode_ctx = (
        (2048, 4, 256, 8, 256) if small else (32768, 4, 4096, 64, 2048)
    )
    page = 128
    num_pages = 2 + (prompt + seqs * seq_len + decode_batch * (decode_ctx + page)) // page
    cache = engine.PagedKVCache(config, num_pages, page, device, dtype)
    for layer in range(config.num_layers):
        for pages in cache.kv(layer):
            pages.normal_()
    counter = PageCounter(cache)
    _prefill(engine, model, cache, backend, counter, device, name, seqs, seq_len, peak, summary)
    _decode(
        engine,
        model,
        cache,
        backend,
        counter,
        device,
        name,
        decode_batch,
        decode_ctx,
        bandwidth,
        summary,
    )
    pages = counter.take(prompt)
    step = 512 if small else 8192
    cold = _ttft(engine, model, cache, backend, device, prompt, 0, step, pages)
    cached = int(prompt * 0.95) // page * page
    warm = _ttft(engine, model, cache, backend, device, prompt, cached, step, pages)
    summary.append([f"{name}: TTFT {prompt // 1024}k prompt, 0% cached, ms", cold * 1e3])
    pct = 100 * cached / prompt
    summary.append([f"{name}: TTFT {prompt // 1024}k prompt, {pct:.0f}% cached, ms", warm * 1e3])


def _prefill(engine, model, cache, backend, counter, device, name, seqs, seq_len, peak, summary):
    config = model.config
    chunks = [engine.SequenceChunk([1] * seq_len, 0, counter.take(seq_len)) for _ in range(seqs)]
    batch = engine.ForwardBatch.build(chunks, cache)
    t = time_median(lambda: model(batch, cache, backend), device, warmup=2, reps=3)
    matmul_params = config.num_parameters() - config.vocab_size * config.hidden_size
    attn = config.num_layers * 4 * config.num_heads * config.head_dim * seqs * seq_len**2 / 2
    flops = 2 * matmul_params * seqs * seq_len + attn
    summary.append([f"{name}: prefill {seqs}x{seq_len} tok/s ({backend.name})", seqs * seq_len / t])
    summary.append([f"{name}:   prefill model TFLOP/s", flops / t / 1e12])
    summary.append([f"{name}:   prefill MFU", flops / t / peak])


def _decode(
    engine, model, cache, backend, counter, device, name, batch_size, ctx, bandwidth, summary
):
    chunks = [engine.SequenceChunk([1], ctx, counter.take(ctx + 1)) for _ in range(batch_size)]
    batch = engine.ForwardBatch.build(chunks, cache)
    t = time_median(lambda: model(batch, cache, backend), device, warmup=2, reps=5)
    cpu = torch.device("cpu")
    t_build = time_median(lambda: engine.ForwardBatch.build(chunks, cache), cpu, warmup=1, reps=3)
    nbytes = model.config.num_parameters() * cache.dtype.itemsize
    nbytes += batch_size * (ctx + 1) * cache.bytes_per_token()
    label = f"{name}: decode batch {batch_size} ctx {ctx}"
    summary.append([f"{label} tok/s (eager)", batch_size / t])
    summary.append([f"{name}:   eager step bytes / copy BW", nbytes / t / bandwidth])
    summary.append([f"{name}:   host batch build, ms", t_build * 1e3])
    t_graph = _graph_step(model, batch, cache, backend, device)
    if t_graph is not None:
        summary.append([f"{label} tok/s (CUDA graph)", batch_size / t_graph])
        summary.append([f"{name}:   graph step bytes / copy BW", nbytes / t_graph / bandwidth])
    _profile_step(lambda: model(batch, cache, backend), device, name)


def _graph_step(model, batch, cache, backend, device) -> float | None:
    """Median seconds of one decode step replayed from a CUDA graph (None where capture fails)."""
    if device.type != "cuda":
        return None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(batch, cache, backend)
        return time_median(graph.replay, device, warmup=2, reps=5)
    except Exception as exc:  # report, keep benchmarking
        print(f"CUDA graph capture of the decode step failed: {type(exc).__name__}: {exc}")
        return None


def _profile_step(step, device, name) -> None:
    """Top ops of one eager decode step by device time and by host time."""
    if device.type != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile

    step()
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        sync(device)
    averages = prof.key_averages()
    print(f"\n## {name} decode step profile, by device time")
    print(averages.table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=50))
    print(f"\n## {name} decode step profile, by host time")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=50))


def _ttft(engine, model, cache, backend, device, prompt, cached, step, pages) -> float:
    """Median seconds from a request's first chunk to its first sampled token."""

    def run() -> None:
        logits = None
        for start in range(cached, prompt, step):
            new = [1] * (min(prompt, start + step) - start)
            chunk = engine.SequenceChunk(new, start, pages)
            logits = model(engine.ForwardBatch.build([chunk], cache), cache, backend)
        int(logits[0].argmax())

    run()
    times = []
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return sorted(times)[1]
