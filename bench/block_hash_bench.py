"""Benchmark: what a block id costs, 64-bit against 128-bit chains, over 1M tokens.

The kvstore's chained block id is `xxh3_64(block tokens, seed=parent id)` (kvstore/hashing.py):
one C call per block. A rank with a disk tier also keeps each block's parent id and tokens, which
its disk file stores and a read compares (the chosen guard against a 64-bit collision). The
128-bit alternatives cannot carry their parent in xxh3's 64-bit seed, so they hash `parent (16
bytes) + block tokens`: xxh3_128 over a joined buffer, BLAKE3 truncated to 128 bits. Prints
milliseconds per 1M tokens and the ratio to the id before, for blocks of 16 and 64 tokens (the
loops alone: no token packing, no manager).
Run: .venv/bin/python bench/block_hash_bench.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import blake3
import numpy as np
import xxhash
from rich.console import Console
from rich.table import Table

Chain = Callable[[bytes, int], list[int]]


def chain_64(data: bytes, block_bytes: int) -> list[int]:
    """The kvstore's ids (SequenceHashes' loop, without its token packing)."""
    digest = xxhash.xxh3_64_intdigest
    view, parent, out = memoryview(data), 0, []
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        parent = digest(view[start : start + block_bytes], seed=parent)
        out.append(parent)
    return out


def chain_64_checked(data: bytes, block_bytes: int) -> list[int]:
    """The kvstore's ids plus what a disk block file is checked against (parent id and
    tokens, `hashing.block_contents`), kept per block as a rank with a disk tier does."""
    digest = xxhash.xxh3_64_intdigest
    view, parent, out, contents = memoryview(data), 0, [], {}
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        block = view[start : start + block_bytes]
        block_hash = digest(block, seed=parent)
        contents[block_hash] = parent.to_bytes(8, "little") + block
        parent = block_hash
        out.append(parent)
    return out


def chain_xxh3_128(data: bytes, block_bytes: int) -> list[int]:
    digest = xxhash.xxh3_128_intdigest
    view, parent, out = memoryview(data), 0, []
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        parent = digest(parent.to_bytes(16, "little") + view[start : start + block_bytes])
        out.append(parent)
    return out


def chain_blake3_128(data: bytes, block_bytes: int) -> list[int]:
    view, parent, out = memoryview(data), 0, []
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        hasher = blake3.blake3(parent.to_bytes(16, "little"))
        hasher.update(view[start : start + block_bytes])
        parent = int.from_bytes(hasher.digest(16), "little")
        out.append(parent)
    return out


CHAINS: dict[str, Chain] = {
    "xxh3_64 seeded (before)": chain_64,
    "xxh3_64 + disk check (after)": chain_64_checked,
    "xxh3_128(parent+block)": chain_xxh3_128,
    "blake3-128(parent+block)": chain_blake3_128,
}


def best_ms(chain: Chain, data: bytes, block_bytes: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        chain(data, block_bytes)
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = rng.integers(0, 150_000, args.tokens, dtype="<u4").tobytes()
    table = Table(title=f"chained block ids over {args.tokens:,} tokens (best of {args.repeats})")
    for column in ("chain", "block", "ms", "ns / block", "x before"):
        table.add_column(column, justify="right")
    for block in (16, 64):
        now = None
        for name, chain in CHAINS.items():
            ms = best_ms(chain, data, 4 * block, args.repeats)
            now = now or ms
            per_block = 1e6 * ms / (args.tokens // block)
            table.add_row(name, str(block), f"{ms:.1f}", f"{per_block:.0f}", f"{ms / now:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
