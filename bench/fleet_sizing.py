"""The replay's workload and the KV budget per rank that holds a stated share of its working set.

The working set is every distinct prompt block the replayed turns carry (the oracle's
infinite cache at the end of the run), in the model's KV bytes. Both the hardware fleet and
the simulator are sized from it, in bytes, so their tiers hold the same share.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvfleet.services.replay.oracle import PrefixOracle
from kvfleet.services.replay.readers import (
    ReadOptions,
    filter_max_model_len,
    first_turns,
    read_traces,
)

GIB = 1 << 30


def report_half(folder: Path, count: int, max_model_len: int) -> list[Path]:
    """The first `count` files (by name) of sim_sweep.py's `report` half of a trace folder
    (files ordered by the SHA-256 of their name, every second one from the second) that keep a
    turn within `max_model_len`: a session with none would replay nothing."""
    return _half(folder, count, max_model_len, 1)


def tune_half(folder: Path, count: int, max_model_len: int) -> list[Path]:
    """The same pick from the `tune` half (every second file from the first): settings are
    chosen on these and reported on `report_half`."""
    return _half(folder, count, max_model_len, 0)


def _half(folder: Path, count: int, max_model_len: int, first: int) -> list[Path]:
    files = sorted(folder.glob("trace_*.json"))
    hashed = sorted(files, key=lambda path: hashlib.sha256(path.stem.encode()).hexdigest())
    kept = []
    for path in sorted(hashed[first::2]):
        if len(kept) == count:
            break
        if filter_max_model_len(read_traces([path], ReadOptions()), max_model_len):
            kept.append(path)
    return kept


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    return 2 * layers * kv_heads * head_dim * dtype_bytes  # K and V


@dataclass(frozen=True)
class FleetSizing:
    working_set_tokens: int
    working_set_gib: float
    gpu_gib_per_rank: float
    host_gib_per_rank: float
    longest_prompt_tokens: int = 0  # a rank's pool must hold this turn alone

    def pages(self, gib: float, page_tokens: int, bytes_per_token: int) -> int:
        return max(2, int(gib * GIB // (page_tokens * bytes_per_token)))


def size_fleet(
    traces: list[Path],
    max_model_len: int,
    max_turns: int | None,
    bytes_per_token: int,
    ranks: int,
    gpu_share: float,
    gpu_host_share: float,
) -> FleetSizing:
    """Device and host tier bytes per rank: `gpu_share` of the working set on the GPUs and
    `gpu_host_share` on GPUs and hosts together, split evenly over the ranks."""
    conversations = filter_max_model_len(read_traces(traces, ReadOptions()), max_model_len)
    if max_turns is not None:
        conversations = first_turns(conversations, max_turns)
    oracle = PrefixOracle()
    block_size = 64
    longest = 0
    stack = list(conversations)
    while stack:
        conversation = stack.pop()
        for step in conversation.steps:
            if hasattr(step, "hash_ids"):
                oracle.offer(step)
                block_size = step.block_size
                longest = max(longest, step.input_tokens)
            else:
                stack.extend(step.conversations())
    tokens = oracle.unique_blocks * block_size
    gib = tokens * bytes_per_token / GIB
    return FleetSizing(
        tokens,
        gib,
        gib * gpu_share / ranks,
        gib * (gpu_host_share - gpu_share) / ranks,
        longest,
    )


def main() -> None:
    """Print a half's files and the fleet's KV GiB per rank (the 1b shape, 4 ranks, 50 % of the
    working set on GPUs, 75 % on GPUs + hosts, as bench/fleet_replay.py sizes it)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--half", choices=("tune", "report"), default="report")
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--max-turns", type=int, default=24)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    pick = tune_half if args.half == "tune" else report_half
    files = pick(args.folder, args.count, args.max_model_len)
    per_token = kv_bytes_per_token(16, 8, 64)  # the 1b preset
    sizing = size_fleet(files, args.max_model_len, args.max_turns, per_token, args.ranks, 0.5, 0.75)
    print(" ".join(str(path) for path in files))
    print(f"gpu_gib={sizing.gpu_gib_per_rank:.4f},host_gib={sizing.host_gib_per_rank:.4f}")


if __name__ == "__main__":
    main()
