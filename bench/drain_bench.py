"""Benchmark: a draining rank's flush of retained turns to the shared disk tier.

A manager with real device KV (`--layers` layers per life cycle) retains `--conversations`
conversations of `--prompt-tokens` tokens each (full + sliding-window life cycles,
per_conversation(2), checkpoints on), then `flush_retained_to_disk()` writes every retained
block: device pages -> staging rows -> checksummed atomic block files. The baseline, timed in
the same run on the same pages, is the plainest way to the same bytes on disk: one `copy_` of a
page to host and one `open/write` per file (no header, checksum, temp file or index). Second
table: the flush a context end pays while draining when its conversation is already on disk
(index look-ups only).

Run: .venv/bin/python bench/drain_bench.py [--device cuda] [--layers 4] [--conversations 2]
(on a GPU machine without an install: PYTHONPATH=bench python bench/drain_bench.py).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from tier_bench import import_tiers


def build_manager(args, disk_dir: str):
    """A tiered manager over `disk_dir` whose conversations each retain one finished turn."""
    import_tiers()
    from kvfleet.kvstore.config import KVStoreConfig
    from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
    from kvfleet.kvstore.manager import KVCacheManager
    from kvfleet.kvstore.policies import PerConversation
    from kvfleet.kvstore.tiers.build import TierConfig, build_tiers
    from kvfleet.kvstore.tiers.layout import KVLayout

    block = args.page_size
    life_cycles = (FullLifeCycle("full"), WindowLifeCycle("swa", args.window_tokens))
    blocks_per_turn = args.prompt_tokens // block + 1
    pages = args.conversations * blocks_per_turn + 8
    store = KVStoreConfig(
        block_size=block,
        life_cycles=life_cycles,
        pool_pages={"full": pages, "swa": pages},
        reuse_policy=PerConversation(max_num_turns=2),
        checkpoint=True,
    )
    layout = KVLayout(
        page_size=block,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        layers={
            "full": tuple(range(0, 2 * args.layers, 2)),
            "swa": tuple(range(1, 2 * args.layers, 2)),
        },
        dtype="bfloat16",
    )
    tiers = build_tiers(
        store, TierConfig(disk_pages={"full": pages, "swa": pages}, disk_dir=disk_dir), layout,
        args.device,
    )  # fmt: skip
    manager = KVCacheManager(store, tiers=tiers)
    for name in ("full", "swa"):
        tiers.device_kv.storage(name).normal_()
    for index in range(args.conversations):
        prompt = [index * 1_000_003 + t for t in range(args.prompt_tokens)]
        request = f"c{index}-t1"
        manager.add_request(request, prompt, conversation_id=f"c{index}")
        manager.admit(request, args.prompt_tokens)
        manager.commit(request, args.prompt_tokens)
        manager.finish_context(request)
        manager.finish_request(request)
    return manager


def flush_seconds(args, root: Path) -> tuple[float, int, float, int]:
    """Best seconds of a full flush (fresh folder and manager each rep), the blocks it wrote,
    best seconds of a re-flush of one conversation already on disk and its blocks."""
    best, written, again, per_conversation = float("inf"), 0, float("inf"), 0
    for rep in range(args.reps + 1):
        folder = root / f"drain-{rep}"
        manager = build_manager(args, str(folder))
        per_conversation = manager.num_retained_off_disk("c0")
        start = time.perf_counter()
        written = manager.flush_retained_to_disk()
        elapsed = time.perf_counter() - start
        start = time.perf_counter()
        manager.flush_retained_to_disk("c0")
        elapsed_again = time.perf_counter() - start
        if rep:  # the first rep warms up
            best, again = min(best, elapsed), min(again, elapsed_again)
        manager.check_integrity()
        manager.tiers.close()
        shutil.rmtree(folder)
    return best, written, again, per_conversation


def plain_seconds(args, root: Path, num_pages: int) -> float:
    """Best seconds of copying `num_pages` pages to host and writing one file each."""
    shape = (args.layers, 2, args.page_size, args.kv_heads, args.head_dim)
    device_pages = torch.randn((num_pages, *shape), device=args.device).to(torch.bfloat16)
    host = torch.empty(shape, dtype=torch.bfloat16)
    best = float("inf")
    for rep in range(args.reps + 1):
        folder = root / f"plain-{rep}"
        folder.mkdir()
        start = time.perf_counter()
        for index in range(num_pages):
            host.copy_(device_pages[index])
            with open(folder / f"{index:016x}.kvb", "wb") as out:
                out.write(memoryview(host.view(torch.uint8).numpy()))
        elapsed = time.perf_counter() - start
        if rep:
            best = min(best, elapsed)
        shutil.rmtree(folder)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--layers", type=int, default=16 if cuda else 4)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window-tokens", type=int, default=1024)
    parser.add_argument("--prompt-tokens", type=int, default=8192 if cuda else 2048)
    parser.add_argument("--conversations", type=int, default=4 if cuda else 2)
    parser.add_argument("--disk-dir", default=None, help="folder on the volume to measure")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="drain-bench-", dir=args.disk_dir))
    try:
        drain, blocks, again, per_conversation = flush_seconds(args, root)
        plain = plain_seconds(args, root, blocks)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    page_bytes = args.layers * 2 * args.page_size * args.kv_heads * args.head_dim * 2
    gb = blocks * page_bytes / 1e9
    print(
        f"device {args.device}, page {page_bytes / 2**20:.1f} MiB, {args.conversations} "
        f"conversations x {args.prompt_tokens} tokens, best of {args.reps}"
    )
    print("| path | blocks | GB | drain GB/s | plain GB/s | drain / plain |")
    print("|---|---|---|---|---|---|")
    print(
        f"| device -> disk, retained turns | {blocks} | {gb:.3f} | {gb / drain:.2f} | "
        f"{gb / plain:.2f} | {plain / drain:.2f} |"
    )
    print()
    print("| context end while draining | blocks checked | µs total | µs / block | / full flush |")
    print("|---|---|---|---|---|")
    print(
        f"| re-flush, conversation on disk | {per_conversation} | {again * 1e6:.0f} | "
        f"{again * 1e6 / per_conversation:.2f} | {again / drain:.4f} |"
    )


if __name__ == "__main__":
    main()
