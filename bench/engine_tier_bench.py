"""Returning turns whose prefix was evicted from the device: host tier vs recompute, same run.

Each conversation sends turn 1, then other conversations flood the small device pool, then
turn 2 (turn 1 + output + new tokens) returns. Without a host tier turn 2 recomputes; with one
its prefix is onboarded from host. Prints TTFT of the returning turns and the prefix reuse.

    .venv/bin/python bench/engine_tier_bench.py [--prompt-tokens 1024] [--conversations 4]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.request.engine_request import GenerateCall


def _call(rid: str, prompt, max_tokens: int) -> GenerateCall:
    return GenerateCall(rid, tuple(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens))


def _run(core: EngineCore, call: GenerateCall):
    outputs = list(core.submit(call).outputs(600.0))
    return [t for o in outputs for t in o.token_ids], outputs[-1].usage


def run(config: EngineConfig, prompt_tokens: int, conversations: int) -> tuple[list[float], float]:
    """TTFT of each returning turn and the token-weighted prefix reuse of those turns."""
    rng = random.Random(0)
    core = EngineCore(config).start()
    ttfts, cached, prompts = [], 0, 0
    try:
        for c in range(conversations):
            first = [rng.randrange(256) for _ in range(prompt_tokens)]
            output, _ = _run(core, _call(f"c{c}-t1", first, 8))
            for f in range(2):  # a flood of the device pool
                flood = [rng.randrange(256) for _ in range(prompt_tokens)]
                _run(core, _call(f"c{c}-flood{f}", flood, 2))
            second = [*first, *output, *(rng.randrange(256) for _ in range(64))]
            started = time.perf_counter()
            _, usage = _run(core, _call(f"c{c}-t2", second, 1))
            ttfts.append(time.perf_counter() - started)
            cached += usage.cached_tokens
            prompts += usage.prompt_tokens
        core.check_integrity()
    finally:
        core.stop()
    return ttfts, cached / prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--conversations", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pages = -(-(args.prompt_tokens + 200) // 16) + 8  # one request at a time, no more
    base = EngineConfig(
        model="tiny", max_batch_size=1, max_num_batched_tokens=512, kv_pages=pages,
        reuse_policy="per_request", disk_prefetch_num_reqs=0,
    )  # fmt: skip
    rows = []
    for name, config in (
        ("device only (recompute)", base),
        ("host tier", base.with_changes(host_kv_pages=8 * pages)),
    ):
        ttfts, reuse = run(config, args.prompt_tokens, args.conversations)
        rows.append((name, statistics.median(ttfts), reuse))
    print(f"{'returning turn, prefix evicted':<26} {'TTFT p50 ms':>12} {'reuse':>7} {'ratio':>7}")
    for name, ttft, reuse in rows:
        print(f"{name:<26} {ttft * 1e3:>12.2f} {reuse:>7.3f} {rows[0][1] / ttft:>7.2f}")


if __name__ == "__main__":
    main()
