"""Disaggregation benchmark (CPU, tiny model, real ranks over gRPC): a multi-turn workload
through a router in front of one `both` rank (aggregated, the baseline) and in front of a
context + a generation rank (disaggregated), in the same run.

Prints wall time, output tok/s, mean TTFT, and hand-off bytes per request moved vs. what
would have moved without skipping the blocks the generation rank already held.
    .venv/bin/python bench/disagg_bench.py [--conversations 4 --turns 4 --prompt 400]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "disagg"))
from disagg_kit import CONFIG, router_generate, start_rank, start_router, tokens


def conversations(count: int, turns: int, prompt: int, grow: int, seed: int = 0):
    """Per conversation: first prompt; each later turn resends it with the answer + new tokens."""
    rng = random.Random(seed)
    return [([rng.randrange(256) for _ in range(prompt)], grow) for _ in range(count)]


def run(router_address: str, convs, turns: int, max_tokens: int):
    """Every conversation on its own thread; returns (seconds, output tokens, ttfts)."""

    def conversation(index: int):
        prompt, grow = convs[index]
        rng = random.Random(index)
        ttfts, out = [], 0
        for _ in range(turns):
            responses = router_generate(router_address, f"c{index}", prompt, max_tokens)
            ttfts.append(responses[-1].chunk.usage.ttft_seconds)
            answer = tokens(responses)
            out += len(answer)
            prompt = [*prompt, *answer, *(rng.randrange(256) for _ in range(grow))]
        return out, ttfts

    start = time.perf_counter()
    with ThreadPoolExecutor(len(convs)) as pool:
        results = list(pool.map(conversation, range(len(convs))))
    seconds = time.perf_counter() - start
    return seconds, sum(r[0] for r in results), [t for r in results for t in r[1]]


def sample(rank, name: str, **labels) -> float:
    return rank.metrics.registry.get_sample_value(name, labels or None) or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=400)
    parser.add_argument("--grow", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    convs = conversations(args.conversations, args.turns, args.prompt, args.grow)
    config = {"max_batch_size": args.conversations, "kv_pages": 400}
    rows = {}

    router, address = start_router()
    both = start_rank("both", address, **config)
    rows["aggregated (1 both)"] = run(address, convs, args.turns, args.max_tokens)
    both.stop(grace=0.2)
    router.stop(grace=0.2)

    router, address = start_router()
    context = start_rank("context", address, **config)
    generation = start_rank("generation", address, **config)
    rows["disaggregated (1+1)"] = run(address, convs, args.turns, args.max_tokens)
    moved = sample(generation, "kvfleet_engine_handoff_bytes_total", direction="received",
                   transport="grpc")  # fmt: skip
    skipped = sample(generation, "kvfleet_engine_handoff_bytes_skipped_total")
    blocks = sample(generation, "kvfleet_engine_handoff_blocks_total", direction="received",
                    transport="grpc")  # fmt: skip
    blocks_skipped = sample(generation, "kvfleet_engine_handoff_blocks_skipped_total")
    seconds = generation.metrics.registry.get_sample_value(
        "kvfleet_engine_handoff_seconds_sum", {"transport": "grpc"}
    )
    for rank in (context, generation):
        rank.core.check_integrity()
        rank.stop(grace=0.2)
    router.stop(grace=0.2)

    requests = args.conversations * args.turns
    print(f"{requests} turns ({args.conversations} conversations x {args.turns}), first prompt "
          f"{args.prompt} tokens, +{args.grow} + answer per turn, {args.max_tokens} out; "
          f"page {CONFIG.page_size} tokens")  # fmt: skip
    base = rows["aggregated (1 both)"]
    print(f"{'fleet':<22}{'wall s':>8}{'out tok/s':>11}{'TTFT mean ms':>14}{'tok/s ratio':>13}")
    for name, (wall, out, ttfts) in rows.items():
        ratio = (out / wall) / (base[1] / base[0])
        print(f"{name:<22}{wall:>8.2f}{out / wall:>11.1f}{statistics.mean(ttfts) * 1e3:>14.1f}"
              f"{ratio:>13.2f}")  # fmt: skip
    print()
    print(f"{'hand-off per request':<34}{'blocks':>8}{'KiB':>10}")
    print(f"{'moved (skipping held blocks)':<34}{blocks / requests:>8.1f}"
          f"{moved / requests / 1024:>10.1f}")  # fmt: skip
    print(f"{'without skipping':<34}{(blocks + blocks_skipped) / requests:>8.1f}"
          f"{(moved + skipped) / requests / 1024:>10.1f}")  # fmt: skip
    print(f"{'ratio moved / without skipping':<34}{blocks / (blocks + blocks_skipped):>8.2f}"
          f"{moved / (moved + skipped):>10.2f}")  # fmt: skip
    print(f"mean hand-off time (fetch + install): {seconds / requests * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
