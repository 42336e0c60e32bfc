"""FP8 vs bf16 KV on one GPU: decode tokens/s of the 8b shape at batch 64 (eager and CUDA
graph, flash backend), and how far greedy decoding with an fp8 cache agrees with a bf16 one.

An fp8 cache's decode step reads the fp8 pages in a Triton kernel (attn_decode_kernel.py);
the baseline row gathers the batch's pages and dequantizes them before flash-attn (the path
prefill chunks take: reads fp8, writes bf16 and reads bf16), and the bf16 cache's row is
flash-attn itself.
Greedy agreement: the same prompts decoded `--agree-tokens` steps with each cache; reports the
tokens before the first difference and the position-wise equal share (random-weight models
have flat logits: a checkpoint via --model-path gives the figure that matters).

Run (on the device, see fp8_kv.sh): python3 bench/gpu/fp8_kv_bench.py [--ctx 2048,8192]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gpu_common import import_engine, print_table, sync, time_median

PAGE = 128


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="8b", help="preset shape (random weights)")
    parser.add_argument("--model-path", default="", help="a local checkpoint instead")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ctx", default="2048,8192", help="decode context lengths")
    parser.add_argument("--agree-prompts", type=int, default=4)
    parser.add_argument("--agree-prompt-tokens", type=int, default=512)
    parser.add_argument("--agree-tokens", type=int, default=300)
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "/tmp"), "fp8.json"))
    return parser.parse_args()


def load_model(engine, args, device):
    if args.model_path:
        from kvfleet.services.engine.model.weights import load_checkpoint

        return load_checkpoint(args.model_path, device, torch.bfloat16)
    config = engine.preset(args.model)
    return engine.build_model(config, seed=0, device=device, dtype=torch.bfloat16)


def make_cache(engine, model, num_pages, kv_dtype, scales, device):
    """A cache of `num_pages` pages in `kv_dtype`, every page filled (contents do not change a
    step's time)."""
    fp8 = kv_dtype == torch.float8_e4m3fn
    cache = engine.PagedKVCache(
        model.config, num_pages, PAGE, device, kv_dtype, scales=scales if fp8 else None
    )
    for layer in range(model.config.num_layers):
        for pages in cache.kv(layer):  # page 0 (null) stays zero
            pages[1:].copy_(torch.randn(pages[1:].shape, device=device, dtype=torch.bfloat16))
    return cache


def decode_speed(engine, model, kv_dtype, scales, batch, ctx, device) -> dict:
    """Tokens/s of one decode step of `batch` sequences at context `ctx`, eager and graphed."""
    per_seq = -(-(ctx + 1) // PAGE)
    cache = make_cache(engine, model, 1 + batch * per_seq, kv_dtype, scales, device)
    backend = engine.make_backend(None, device)
    chunks = []
    for b in range(batch):
        ids = list(range(1 + b * per_seq, 1 + (b + 1) * per_seq))
        chunks.append(engine.SequenceChunk([1], ctx, dict.fromkeys(cache.num_pages, ids)))
    step = engine.ForwardBatch.build(chunks, cache)
    eager = time_median(lambda: model(step, cache, backend), device, warmup=2, reps=5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(step, cache, backend)
    graphed = time_median(graph.replay, device, warmup=2, reps=10)
    kv_gib = batch * (ctx + 1) * cache.bytes_per_token() / (1 << 30)  # what a step reads
    return {
        "backend": backend.name,
        "eager_tok_s": batch / eager,
        "graph_tok_s": batch / graphed,
        "graph_step_ms": graphed * 1e3,
        "kv_gib_read": kv_gib,
    }


def greedy(engine, model, kv_dtype, scales, prompt, count, device) -> list[int]:
    pages = 2 + -(-(len(prompt) + count) // PAGE)
    cache = make_cache(engine, model, pages, kv_dtype, scales, device)
    backend = engine.make_backend(None, device)
    params = engine.SamplingParams(temperature=0.0, max_tokens=count)
    return engine.generate(model, cache, backend, prompt, params, prefill_chunk=2048).token_ids


def agreement(engine, model, scales, args, device) -> dict:
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    before_first, equal, total, per_prompt = 0, 0, 0, []
    for _ in range(args.agree_prompts):
        prompt = torch.randint(0, vocab, (args.agree_prompt_tokens,), generator=generator).tolist()
        ref = greedy(engine, model, torch.bfloat16, None, prompt, args.agree_tokens, device)
        fp8 = greedy(engine, model, torch.float8_e4m3fn, scales, prompt, args.agree_tokens, device)
        first = next(
            (i for i, (a, b) in enumerate(zip(ref, fp8, strict=False)) if a != b), len(ref)
        )
        same = sum(a == b for a, b in zip(ref, fp8, strict=False))
        before_first, equal, total = before_first + first, equal + same, total + len(ref)
        per_prompt.append(first)
    return {
        "tokens": total,
        "before_first_difference": before_first,
        "position_wise_equal": equal,
        "first_difference_per_prompt": per_prompt,
    }


def main() -> None:
    args = parse_args()
    device = torch.device("cuda")
    engine = import_engine()
    from kvfleet.services.engine.attention import attn_flash
    from kvfleet.services.engine.kv.kv_calibration import calibrate_kv_scales

    t0 = time.perf_counter()
    model = load_model(engine, args, device)
    sync(device)
    scales = calibrate_kv_scales(model, model.config.groups, device)
    took = time.perf_counter() - t0
    name = args.model_path or args.model
    print(f"model {name} on {torch.cuda.get_device_name()} in {took:.1f} s")
    print(f"fp8 scales tag {scales.tag() or '(all 1)'}")
    results: dict = {"decode": {}, "agreement": None}
    rows = []
    for ctx in (int(c) for c in args.ctx.split(",")):
        arms = (
            ("bf16", torch.bfloat16, True),
            ("fp8_e4m3, gather + dequantize (baseline)", torch.float8_e4m3fn, False),
            ("fp8_e4m3, Triton decode kernel", torch.float8_e4m3fn, True),
        )
        for name, dtype, kernel in arms:
            attn_flash.use_fp8_decode_kernel(kernel)
            speed = decode_speed(engine, model, dtype, scales, args.batch, ctx, device)
            torch.cuda.empty_cache()  # the step's cache and graph are gone: give their memory back
            results["decode"][f"{name}/ctx{ctx}"] = speed
            label = f"{name} batch {args.batch} ctx {ctx}"
            figures = ("eager_tok_s", "graph_tok_s", "graph_step_ms", "kv_gib_read")
            rows.append([label, *(speed[key] for key in figures)])
            print(rows[-1], flush=True)
    print_table(
        "decode, flash backend",
        ["kv cache", "eager tok/s", "CUDA graph tok/s", "graph step ms", "KV GiB read"],
        rows,
    )
    attn_flash.use_fp8_decode_kernel(True)
    results["agreement"] = agreement(engine, model, scales, args, device)
    print("greedy agreement fp8 vs bf16 KV:", json.dumps(results["agreement"]))
    with open(args.json, "w") as out:
        json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
