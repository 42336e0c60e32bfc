"""GPU benchmark of the engine's compute half (run on the H200 through bench/gpu/run.sh).

Prints, all measured in the same run: the copy bandwidth and bf16 matmul peak; weight-init
determinism across devices; paged attention correctness of every backend against the fp32
reference; a whole-model check against the fp32 dense forward; prefill attention TFLOP/s (MFU)
for flash-attn and SDPA; decode attention KV-read bandwidth against the copy bandwidth; prefill
and decode tokens/s of the 1b- and 8b-shaped models; TTFT of a 32k prompt 0 % and 95 % cached.

    python bench/gpu_engine_bench.py            # on the GPU
    python bench/gpu_engine_bench.py --small    # CPU smoke run of the same code paths
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_attention_bench import check_correctness, decode_perf, prefill_perf
from gpu_common import import_engine, measure_ceilings, print_table
from gpu_model_bench import model_perf

SUMMARY: list[list[object]] = []


def check_init_determinism(engine, device) -> None:
    """The same seed gives bit-identical weights on the CPU and on `device`."""
    config = engine.preset("tiny")
    on_cpu = engine.build_model(config, seed=7).state_dict()
    on_dev = engine.build_model(config, seed=7, device=device).state_dict()
    equal = all(torch.equal(on_cpu[k], on_dev[k].cpu()) for k in on_cpu)
    SUMMARY.append(["seeded init CPU == device, bitwise", equal])
    if not equal:
        raise AssertionError("seeded weights differ between CPU and device")


def check_model(engine, device) -> None:
    """bf16 paged chunked forward on `device` vs the fp32 dense forward on the CPU."""
    config = engine.ModelConfig(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_layers=3,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        window_layers=(1,),
        window_size=96,
        name="check",
    )
    tokens = torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(3)).tolist()
    dense = engine.build_model(config, seed=5).forward_dense(torch.tensor(tokens))
    dtype = engine.default_dtype(device)
    model = engine.build_model(config, seed=5, device=device, dtype=dtype)
    cache = engine.PagedKVCache(config, 16, 128, device, dtype)
    backend = engine.make_backend(None, device)
    pages = {g: list(range(1, 7)) for g in cache.num_pages}
    pieces = []
    for start in range(0, len(tokens), 256):
        chunk = engine.SequenceChunk(tokens[start : start + 256], start, pages)
        pieces.append(
            model(engine.ForwardBatch.build([chunk], cache), cache, backend, all_logits=True)
        )
    paged = torch.cat(pieces).cpu()
    err = float((paged - dense).norm() / dense.norm())
    agree = float((paged.argmax(-1) == dense.argmax(-1)).float().mean())
    SUMMARY.append([f"model {backend.name} {dtype} chunked vs fp32 dense: rel err", err])
    SUMMARY.append(["  greedy token agreement", agree])
    if err > 3e-2:
        raise AssertionError(f"model logits error {err:.3g}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes, for a CPU smoke run")
    parser.add_argument("--models", default="1b,8b")
    parser.add_argument("--only", default="", help="comma-separated section names to run")
    parser.add_argument("--decode-batches", default="", help="e.g. 4,8,32 (default 32,64,128)")
    parser.add_argument("--unfused", action="store_true", help="no torch.compile elementwise")
    parser.add_argument("--budget-s", type=float, default=1e9, help="skip sections started later")
    args = parser.parse_args()
    torch.manual_seed(0)
    engine = import_engine()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from kvfleet.services.engine.model import fused  # as the serving path does

    fused.enable(device.type == "cuda" and not args.unfused)
    backends = [b for b in ("flash", "sdpa") if b in engine.available_backends(device)]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, backends {backends}")
    bandwidth, peak = measure_ceilings(device, args.small)
    print_table(
        "ceilings measured now",
        ["what", "value"],
        [
            ["copy bandwidth TB/s (read+write)", bandwidth / 1e12],
            ["bf16 matmul TFLOP/s", peak / 1e12],
        ],
    )
    failures = 0
    batches = tuple(int(b) for b in args.decode_batches.split(",") if b)
    sections = [
        ("init determinism", lambda: check_init_determinism(engine, device)),
        (
            "attention correctness",
            lambda: SUMMARY.append(
                ["paged attention worst rel err", check_correctness(engine, device, backends)]
            ),
        ),
        (
            "decode attention",
            lambda: SUMMARY.append(
                [
                    "decode attention best flash KV read / copy BW",
                    decode_perf(engine, device, bandwidth, backends, args.small, batches),
                ]
            ),
        ),
        ("prefill attention", lambda: prefill_perf(engine, device, peak, backends, args.small)),
        ("model check", lambda: check_model(engine, device)),
        *[
            (
                f"model {m}",
                lambda m=m: model_perf(engine, device, m, args.small, peak, bandwidth, SUMMARY),
            )
            for m in args.models.split(",")
        ],
    ]
    if args.only:
        wanted = set(args.only.split(","))
        sections = [(name, run) for name, run in sections if name in wanted]
    started = time.perf_counter()
    for name, run in sections:
        t0 = time.perf_counter()
        if t0 - started > args.budget_s:
            print(f"\n!! section {name} skipped: past the {args.budget_s:.0f} s budget")
            failures += 1
            continue
        try:
            run()
        except Exception:
            failures += 1
            print(f"\n!! section {name} failed:")
            traceback.print_exc()
        print(f"[{name}: {time.perf_counter() - t0:.1f} s]", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table("summary", ["measure", "value"], SUMMARY)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
