"""Benchmark: the hybrid SSM/attention model at the 8b shape, served through EngineCore.

One table per measure, each with its baseline from the same run:
  prefill  a cold prompt's TTFT and tok/s with the chunked (SSD) scan (in the shipped runs of
           64 tokens, and of 128 and 256), against the token-by-token recurrence on a shorter
           prompt (the scan prefill had before);
  TTFT     a returning turn (the last prompt, its answer and `--suffix` new tokens) with its
           K/V pages and state snapshot cached, against the same turn on an empty cache;
  decode   tok/s of `--batch` sequences decoding together (the batched SSM step, in decode
           graphs), per sequence and in all, against one sequence alone, against
           `--loop-batch` sequences stepped by the per-sequence loop, eagerly (the path before),
           and eagerly at `--batch` with the step's in-place Triton kernels and with the torch
           ops they replaced (gather, update, scatter);
  against attention  prefill tok/s and decode tok/s at `--batch` of the hybrid model beside
           the attention model `--baseline-model` (the 8b: same widths, every layer attention),
           served the same way after the hybrid core is gone.

    python3 bench/gpu/hybrid_bench.py                  # hybrid-8b on the GPU (bf16)
    .venv/bin/python bench/gpu/hybrid_bench.py --small # hybrid-small on CPU (fp32): same code

On the device machine: `bash bench/gpu/run.sh unpack`, then `bash bench/gpu/run.sh hybrid
[args]` (flash-attn from the unpacked archives, else SDPA; the log lands in $OUT/bench.log).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_common import import_engine, print_table

BIG = dict(model="hybrid-8b", baseline_model="8b", prompt=4096, baseline_prompt=512, suffix=128,
           decode=32, batch=64, loop_batch=8, step_tokens=2048)  # fmt: skip
SMALL = dict(model="hybrid-small", baseline_model="tiny", prompt=256, baseline_prompt=128,
             suffix=16, decode=8, batch=8, loop_batch=2, step_tokens=64)  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="hybrid-small on CPU: a smoke run")
    for name, value in BIG.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None)
    args = parser.parse_args()
    for name, value in (SMALL if args.small else BIG).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def make_core(args, engine_config, engine_core, model: str):
    config = engine_config.EngineConfig(
        model=model,
        device="cpu" if args.small else "auto",
        max_batch_size=args.batch,
        max_num_batched_tokens=args.step_tokens,
        max_model_len=args.prompt * 2 + args.suffix + 4 * args.decode + 64,
        cpu_kv_gib=1.0,
        torch_threads=2 if args.small else 1,
    )
    return engine_core.EngineCore(config).start()


def greedy_call(call_id: str, prompt, max_tokens: int, salt: str = ""):
    """A greedy request of its own conversation (`salt`: a cache salt, so it matches nothing)."""
    from kvfleet.services.engine.request.engine_request import GenerateCall
    from kvfleet.services.engine.request.sampling_params import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    conversation = call_id.split("-")[0]
    return GenerateCall(call_id, tuple(prompt), sampling, conversation, cache_salt=salt)


def run(core, call_id: str, prompt, max_tokens: int, salt: str = ""):
    """Greedy tokens and usage of one request."""
    outputs = list(core.submit(greedy_call(call_id, prompt, max_tokens, salt)).outputs(3600.0))
    tokens = [t for o in outputs for t in o.token_ids]
    return tokens, next(o for o in outputs if o.finished).usage


@contextlib.contextmanager
def per_sequence_decode(core, paged_ssm):
    """The decode baseline: no decode graphs, each sequence's SSM layers stepped alone."""
    compute, plan = core.compute, paged_ssm.SSMBatchPlan
    runner, batched = compute.decode, plan.of
    compute.decode, plan.of = None, plan.each
    try:
        yield
    finally:
        compute.decode, plan.of = runner, batched


def decode_round(core, prompt_of, tag: str, batch: int, prompt: int, tokens: int):
    """`batch` fresh sequences decoding `tokens` each together: [ITL s, tok/s per sequence,
    tok/s, wall s]."""
    calls = [greedy_call(f"{tag}{batch}x{i}-t1", prompt_of(prompt), tokens) for i in range(batch)]
    handles = [core.submit(call) for call in calls]
    started = time.perf_counter()
    usages = [next(o for o in h.outputs(3600.0) if o.finished).usage for h in handles]
    wall = time.perf_counter() - started
    itl = statistics.mean(u.mean_itl_seconds for u in usages)
    return [itl, 1 / itl, batch / itl, wall]


@contextlib.contextmanager
def eager_decode(core, ssm_step, kernels: bool):
    """No decode graphs (they keep the step they were captured with); the SSM decode step by
    the in-place kernels or by torch ops."""
    runner, core.compute.decode = core.compute.decode, None
    ssm_step.use_kernel(kernels)
    try:
        yield
    finally:
        core.compute.decode = runner
        ssm_step.use_kernel(True)


@contextlib.contextmanager
def chunk_tokens(ssd_scan, tokens: int):
    """Prefill's chunked scan in runs of `tokens` (the shipped size is the baseline)."""
    shipped, ssd_scan.CHUNK_TOKENS = ssd_scan.CHUNK_TOKENS, tokens
    try:
        yield
    finally:
        ssd_scan.CHUNK_TOKENS = shipped


@contextlib.contextmanager
def token_by_token_prefill(ssm_module):
    """The baseline: prefill chunks scanned by the recurrence, as decode is."""
    cls = ssm_module.SelectiveSSM
    chunked = cls._scan_chunked
    cls._scan_chunked = cls._scan_tokens
    try:
        yield
    finally:
        cls._scan_chunked = chunked


def hybrid_tables(args, core, prompt_of, ssm, paged_ssm, ssd_scan, ssm_step):
    """The hybrid model's own tables; its (prefill tok/s, decode tok/s at `--batch`)."""
    run(core, "warm", prompt_of(args.baseline_prompt), 2)  # kernels, compile
    decode_round(core, prompt_of, "warm", args.batch, args.baseline_prompt, 4)  # graphs
    # prefill: cold prompts, chunked scan against the recurrence
    _, cold = run(core, "cold", prompt_of(args.prompt), 1)
    with token_by_token_prefill(ssm):
        _, slow = run(core, "tbt", prompt_of(args.baseline_prompt), 1)
    sweep = []
    for tokens in (128, 256):  # the default's neighbours (ssd_scan.CHUNK_TOKENS)
        with chunk_tokens(ssd_scan, tokens):
            _, other = run(core, f"chunk{tokens}", prompt_of(args.prompt), 1)
        sweep.append([f"chunked (SSD), runs of {tokens}", args.prompt, other.ttft_seconds,
                      args.prompt / other.ttft_seconds])  # fmt: skip
    print_table(
        f"prefill, {args.model}, steps of {args.step_tokens} tokens",
        ["scan", "prompt", "TTFT s", "prefill tok/s"],
        [
            ["token-by-token (baseline)", args.baseline_prompt, slow.ttft_seconds,
             args.baseline_prompt / slow.ttft_seconds],
            [f"chunked (SSD), runs of {ssd_scan.CHUNK_TOKENS}", args.prompt, cold.ttft_seconds,
             args.prompt / cold.ttft_seconds],
            *sweep,
        ],
    )  # fmt: skip
    # TTFT of a returning turn: cached against an empty cache
    first = prompt_of(args.prompt)
    answer, _ = run(core, "conv-t1", first, args.decode)
    second = [*first, *answer, *prompt_of(args.suffix)]
    _, cached = run(core, "conv-t2", second, 1)
    _, uncached = run(core, "fresh-t2", second, 1, salt="baseline")
    print_table(
        f"TTFT of a returning turn ({len(second)} tokens, {args.suffix} new)",
        ["cache", "cached tokens", "TTFT s"],
        [
            ["empty (baseline)", uncached.cached_tokens, uncached.ttft_seconds],
            ["K/V + state snapshot", cached.cached_tokens, cached.ttft_seconds],
        ],
    )
    # decode: the per-sequence loop (eager), one sequence, then the batch in one step
    shape = (args.baseline_prompt, args.decode)
    with per_sequence_decode(core, paged_ssm):
        loop = ["per-sequence loop, eager (baseline)", args.loop_batch,
                *decode_round(core, prompt_of, "loop", args.loop_batch, *shape)]  # fmt: skip
    one = ["batched step (baseline: 1 sequence)", 1, *decode_round(core, prompt_of, "d", 1, *shape)]
    full = ["batched step", args.batch, *decode_round(core, prompt_of, "d", args.batch, *shape)]
    eager = []
    for kernels, name in ((False, "torch ops (baseline)"), (True, "in-place kernels")):
        with eager_decode(core, ssm_step, kernels):
            figures = decode_round(core, prompt_of, f"e{kernels:d}", args.batch, *shape)
        eager.append([f"batched step, eager, {name}", args.batch, *figures])
    print_table(
        f"decode, {args.decode} tokens after {args.baseline_prompt}-token prompts",
        ["SSM step", "batch", "ITL s", "tok/s per seq", "tok/s", "wall s"],
        [loop, one, full, *eager],
    )
    return args.prompt / cold.ttft_seconds, full[4]


def attention_figures(args, core, prompt_of) -> tuple[float, float]:
    """The attention model's (prefill tok/s, decode tok/s at `--batch`), measured as the
    hybrid's are."""
    run(core, "warm", prompt_of(args.baseline_prompt), 2)
    decode_round(core, prompt_of, "warm", args.batch, args.baseline_prompt, 4)
    _, cold = run(core, "cold", prompt_of(args.prompt), 1)
    decode = decode_round(core, prompt_of, "d", args.batch, args.baseline_prompt, args.decode)
    return args.prompt / cold.ttft_seconds, decode[2]


def on_fresh_core(args, model: str, measure, *extra):
    """`measure(args, core, *extra)` on a new core serving `model`. The core is stopped and no
    longer referenced on return, so its weights, KV and graphs are freed before the next model's
    core sizes its KV from the free memory."""
    from kvfleet.services.engine.config import engine_config
    from kvfleet.services.engine.core import engine_core

    core = make_core(args, engine_config, engine_core, model)
    try:
        return measure(args, core, *extra)
    finally:
        core.stop()
        del core
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            print(f"{model} stopped: {torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated")


def main() -> None:
    args = parse_args()
    import_engine()
    from kvfleet.services.engine.model import paged_ssm, ssd_scan, ssm, ssm_step

    rng = random.Random(0)
    vocab = 256

    def prompt_of(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    hybrid = on_fresh_core(
        args, args.model, hybrid_tables, prompt_of, ssm, paged_ssm, ssd_scan, ssm_step
    )
    attention = on_fresh_core(args, args.baseline_model, attention_figures, prompt_of)
    print_table(
        f"{args.model} against {args.baseline_model} (attention), same run: prefill of a "
        f"{args.prompt}-token prompt, decode at batch {args.batch}",
        ["measure", f"{args.baseline_model} tok/s", f"{args.model} tok/s", "hybrid / attention"],
        [
            ["prefill", attention[0], hybrid[0], hybrid[0] / attention[0]],
            ["decode", attention[1], hybrid[1], hybrid[1] / attention[1]],
        ],
    )


if __name__ == "__main__":
    main()
