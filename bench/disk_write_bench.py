"""What a block written to the disk tier costs the thread that evicts it: in place, as the
engine's core thread does by default, against write-behind (kvstore/tiers/write_behind.py).

Each arm writes the same blocks through `DiskTier.store` (what the kvstore's flush calls for a
block leaving the host tier) into a fresh folder, and reports the caller's time per block and
the time until every file has landed. Blocks are 1b pages by default (16 tokens x 16 layers x
K and V x 8 heads x 64 x bf16 = 512 KiB), as in the fleet replays.

  .venv/bin/python bench/disk_write_bench.py [--blocks 2000] [--block-kib 512] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from kvfleet.kvstore.tiers.disk_files import DiskFiles
from kvfleet.kvstore.tiers.disk_tier import DiskTier
from kvfleet.kvstore.tiers.metrics import TierMetrics
from kvfleet.kvstore.tiers.tier_index import TierIndex
from kvfleet.kvstore.tiers.write_behind import WriteBehindFiles

FINGERPRINT = {"full": b"full/bench"}


def run_arm(files: DiskFiles, blocks: int, block_bytes: int) -> tuple[float, float]:
    """(caller's ms per block, s until every file landed)."""
    tier = DiskTier(TierIndex("disk", {"full": blocks}), files, TierMetrics())
    payload = memoryview(bytearray(os.urandom(block_bytes)))
    started = time.perf_counter()
    for block_hash in range(1, blocks + 1):
        tier.store("full", block_hash, lambda: payload, block_hash.to_bytes(8, "little"))
    caller_s = time.perf_counter() - started
    tier.wait()
    landed_s = time.perf_counter() - started
    tier.close()
    return 1e3 * caller_s / blocks, landed_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=2000)
    p.add_argument("--block-kib", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the folders go (default: the temp dir)")
    args = p.parse_args()
    block_bytes = args.block_kib * 1024
    arms = {"in place": DiskFiles, "write-behind": WriteBehindFiles}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for _ in range(args.repeats):  # alternating, so both arms see the machine alike
        for name, files_class in arms.items():
            with tempfile.TemporaryDirectory(dir=args.dir) as folder:
                results[name].append(run_arm(files_class(folder, FINGERPRINT), args.blocks,
                                             block_bytes))  # fmt: skip
    gb = args.blocks * block_bytes / 1e9
    print(f"{args.blocks} blocks of {args.block_kib} KiB, {args.repeats} runs each "
          f"(median, min-max)")  # fmt: skip
    print("| arm | caller ms per block | s until all landed | GB/s landed |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        caller = [c for c, _ in runs]
        landed = statistics.median(w for _, w in runs)
        spread = f"{min(caller):.3f}-{max(caller):.3f}"
        print(
            f"| {name} | {statistics.median(caller):.3f} ({spread}) | {landed:.2f} "
            f"| {gb / landed:.2f} |"
        )


if __name__ == "__main__":
    main()
