"""Benchmark: the hybrid SSM/attention model (reference recurrent scan) at the 8b shape.

Prefill tok/s of a cold prompt, decode tok/s (one token after the prompt's K/V and states),
and TTFT of a cold prompt against one resumed from cached K/V and states with `--suffix` new
tokens (what a prefix-cache hit saves). The scan runs token by token in torch: a baseline for a
chunked or Triton scan, not a serving figure.

Run (on the device): python3 bench/gpu_hybrid_bench.py [--layers 8] [--prompt 2048]
     locally:        .venv/bin/python bench/gpu_hybrid_bench.py --preset tiny --prompt 128
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from gpu_common import import_engine, print_table, time_median


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=("8b", "tiny"), default="8b")
    parser.add_argument("--layers", type=int, default=8, help="first N layers (memory, time)")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--suffix", type=int, default=64, help="new tokens after a cache hit")
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import_engine()
    from kvfleet.services.engine.models.hybrid import HybridConfig, HybridLM, hybrid_8b, hybrid_tiny

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = hybrid_8b() if args.preset == "8b" else hybrid_tiny()
    layers = min(args.layers, config.base.num_layers)
    config = HybridConfig(
        dataclasses.replace(config.base, num_layers=layers),
        tuple(i for i in config.ssm_layers if i < layers),
        config.ssm,
    )
    torch.manual_seed(0)
    model = HybridLM(config).to(device=device, dtype=dtype).eval()
    prompt = torch.randint(0, config.base.vocab_size, (args.prompt,), device=device)
    empty = {
        i: (torch.empty(0, config.base.num_kv_heads, config.base.head_dim, device=device),) * 2
        for i in config.attention_layers
    }

    def cold():
        return model.forward_chunk(prompt, 0, empty, model.initial_states())

    warm = cold()
    cut = args.prompt - args.suffix
    cached = model.forward_chunk(prompt[:cut], 0, empty, model.initial_states())
    past = {i: tuple(t.to(dtype) for t in cached.kv[i]) for i in cached.kv}

    def resumed():
        return model.forward_chunk(prompt[cut:], cut, past, cached.states)

    whole = {i: tuple(t.to(dtype) for t in warm.kv[i]) for i in warm.kv}
    token = prompt[-1:]

    def decode():
        return model.forward_chunk(token, args.prompt, whole, warm.states)

    timed = {}
    for name, fn in (("cold", cold), ("resumed", resumed), ("decode", decode)):
        timed[name] = time_median(fn, device, warmup=1, reps=args.repeats)
    rows = [
        ["prefill tok/s", f"{args.prompt / timed['cold']:.1f}"],
        ["decode tok/s (1 sequence)", f"{1 / timed['decode']:.2f}"],
        ["TTFT cold s", f"{timed['cold']:.3f}"],
        [f"TTFT resumed s ({args.suffix} new tokens)", f"{timed['resumed']:.3f}"],
        ["TTFT cold / resumed", f"{timed['cold'] / timed['resumed']:.1f}x"],
    ]
    title = f"hybrid {args.preset}, {layers} layers ({len(config.ssm_layers)} SSM), {device}"
    print_table(title, ["figure", "value"], rows)


if __name__ == "__main__":
    main()
