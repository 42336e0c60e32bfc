"""Engine serving benchmark: multi-turn agent-like conversations through the engine core, with
the prefix cache (per_conversation) against the same engine with an empty cache for every turn
(the baseline, measured in the same run).

Prints prefix reuse, mean TTFT, prefill tokens computed and output tokens/s, and ratios.
    .venv/bin/python bench/engine_serving_bench.py [--conversations 4 --turns 4 --prompt 600]
On the H200 (see bench/gpu/run.sh; runs without `pip install -e`):
    python3 bench/engine_serving_bench.py --device cuda --model 1b --prompt 16000 --grow 500
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine

import_engine()  # the device machine runs this from the checkout, not installed

from kvfleet.services.engine.compute.backends import TorchCompute  # noqa: E402
from kvfleet.services.engine.compute.sampling import SamplingParams  # noqa: E402
from kvfleet.services.engine.config.engine_config import EngineConfig  # noqa: E402
from kvfleet.services.engine.core.engine_core import EngineCore  # noqa: E402
from kvfleet.services.engine.request.engine_request import GenerateCall  # noqa: E402


def conversations(count: int, turns: int, prompt: int, grow: int, vocab: int, seed: int = 0):
    """Per conversation, its turns' prompts: each resends the last one plus new tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        prompts = [[rng.randrange(vocab) for _ in range(prompt)]]
        while len(prompts) < turns:
            prompts.append(prompts[-1] + [rng.randrange(vocab) for _ in range(grow)])
        out.append(prompts)
    return out


def run(config: EngineConfig, compute: TorchCompute, convs, max_tokens: int, fresh: bool):
    """Serve every turn, conversations interleaved; returns (reuse, ttfts, computed, out tok/s)."""
    core = EngineCore(config, compute=compute).start()
    ttfts, prompt_total, cached_total, output_total = [], 0, 0, 0
    start = time.perf_counter()
    try:
        for turn in range(len(convs[0])):
            if fresh:
                core.stop()
                core = EngineCore(config, compute=compute).start()
            handles = [
                core.submit(
                    GenerateCall(
                        f"c{c}-t{turn}",
                        tuple(conv[turn]),
                        SamplingParams(max_tokens=max_tokens),
                        f"c{c}",
                    )
                )
                for c, conv in enumerate(convs)
            ]
            for handle in handles:
                usage = [o for o in handle.outputs(300) if o.finished][-1].usage
                ttfts.append(usage.ttft_seconds)
                prompt_total += usage.prompt_tokens
                cached_total += usage.cached_tokens
                output_total += usage.completion_tokens
        core.check_integrity()
    finally:
        core.stop()
    elapsed = time.perf_counter() - start
    return cached_total / prompt_total, ttfts, prompt_total - cached_total, output_total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=600)
    parser.add_argument("--grow", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default="tiny", help="preset: tiny, 1b, 8b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4, help="max_batch_size")
    parser.add_argument("--batched-tokens", type=int, default=256, help="per-step token budget")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--kv-pages", type=int, default=600)
    parser.add_argument("--decode-graphs", default="auto", help="auto, static or off")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_batch_size=args.batch,
        max_num_batched_tokens=args.batched_tokens,
        page_size=args.page_size,
        kv_pages=args.kv_pages,
        decode_graphs=args.decode_graphs,
    )
    compute = TorchCompute(config)
    vocab = min(compute.model_config.vocab_size, 256 if args.model == "tiny" else 32000)
    print(f"model {args.model} on {args.device}, attention {compute.attention.name}, "
          f"{args.conversations} conversations x {args.turns} turns, prompt {args.prompt} "
          f"+{args.grow}/turn, {args.max_tokens} out")  # fmt: skip
    convs = conversations(args.conversations, args.turns, args.prompt, args.grow, vocab)
    rows = {
        "empty cache (baseline)": run(config, compute, convs, args.max_tokens, fresh=True),
        "prefix cache": run(config, compute, convs, args.max_tokens, fresh=False),
    }
    base = rows["empty cache (baseline)"]
    print(f"{'engine':24} {'reuse':>6} {'TTFT mean ms':>13} {'computed tok':>13} "
          f"{'out tok/s':>10} {'TTFT x':>7} {'out tok/s x':>11}")  # fmt: skip
    for name, (reuse, ttfts, computed, tps) in rows.items():
        ttft = statistics.mean(ttfts)
        print(f"{name:24} {reuse:6.1%} {ttft * 1000:13.1f} {computed:13d} {tps:10.1f} "
              f"{statistics.mean(base[1]) / ttft:7.2f} {tps / base[3]:11.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
