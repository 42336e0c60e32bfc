"""Benchmark: KV tier copy throughput per boundary against a plain copy of the same bytes.

For each boundary the tier path (batched gather/scatter on a side stream for device<->host,
checksummed atomic files for disk) is timed next to the plainest copy of the same bytes in the
same run: one `tensor.copy_` between a contiguous device buffer and a pinned host buffer, and
one `open/write` or `open/readinto` per block file. The ratio (tier / plain) is the figure.

Run: PYTHONPATH=. python bench/tier_bench.py [--device cuda] [--pages 64] [--layers 32]
(or .venv/bin/python bench/tier_bench.py; without an install the repo is imported in place).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def import_tiers():
    """The tier modules, installed or straight from this checkout (the device machine)."""
    try:
        import kvfleet.kvstore.tiers.torch_bytes  # noqa: F401
    except ImportError:
        shim = Path(tempfile.mkdtemp(prefix="kvfleet-shim-")) / "kvfleet"
        shim.mkdir()
        (shim / "kvstore").symlink_to(REPO / "kvstore")
        sys.path.insert(0, str(shim.parent))
    from kvfleet.kvstore.tiers import disk_files, layout, stack, torch_bytes

    return disk_files, layout, stack, torch_bytes


def seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Best wall seconds of `fn()` over `reps` (device synchronized) after one warm-up.

    NOTE: the best, not the median, because shared CPUs here make single runs several times
    slower at random; both sides of every ratio are timed the same way.
    """

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def device_host_rows(args, mods, device):
    """Offload and onboard through TorchBytes vs one plain copy_ of the same bytes."""
    _, layout_mod, _, torch_bytes = mods
    layers = {"full": tuple(range(args.layers))}
    layout = layout_mod.KVLayout(args.page_size, args.kv_heads, args.head_dim, layers, "bfloat16")
    n = args.pages
    store = torch_bytes.TorchBytes(layout, {"full": 2 * n + 1}, {"full": 2 * n}, device)
    page_bytes = layout.page_bytes("full")
    store.kv.storage("full").normal_()
    rng = random.Random(0)
    pages = rng.sample(range(1, 2 * n + 1), n)
    scattered = rng.sample(range(2 * n), n)
    total = n * page_bytes
    pin = device.type == "cuda"
    plain_dev = torch.empty(total // 2, dtype=torch.bfloat16, device=device)
    plain_host = torch.empty(total // 2, dtype=torch.bfloat16, pin_memory=pin)

    def offload(slots):
        return lambda: store.offload("full", pages, slots)

    def onboard(slots):
        rows = [store.host_row("full", slot) for slot in slots]
        return lambda: store.onboard("full", pages, rows)

    rows = [
        (
            "device -> host",
            "offload, consecutive slots",
            offload(list(range(n))),
            lambda: plain_host.copy_(plain_dev, non_blocking=True),
        ),
        (
            "device -> host",
            "offload, scattered slots",
            offload(scattered),
            lambda: plain_host.copy_(plain_dev, non_blocking=True),
        ),
        (
            "host -> device",
            "onboard, consecutive slots",
            onboard(list(range(n))),
            lambda: plain_dev.copy_(plain_host, non_blocking=True),
        ),
        (
            "host -> device",
            "onboard, scattered slots",
            onboard(scattered),
            lambda: plain_dev.copy_(plain_host, non_blocking=True),
        ),
    ]
    results = []
    for boundary, what, tier_fn, plain_fn in rows:
        tier_s = seconds(tier_fn, device, args.reps)
        plain_s = seconds(plain_fn, device, args.reps)
        results.append((boundary, what, total, tier_s, plain_s))
    store.synchronize()
    for page, slot in ((pages[0], scattered[0]), (pages[-1], scattered[-1])):
        on_device = store.kv.storage("full")[:, :, page].cpu()
        if not torch.equal(on_device, store.host_row("full", slot)):
            raise SystemExit(f"device page {page} differs from host slot {slot} after the runs")
    return results, page_bytes


def disk_rows(args, mods, page_bytes):
    """Block files through DiskFiles (header, checksum, temp + rename) vs plain write/read."""
    disk_files = mods[0]
    folder = Path(args.disk_dir or tempfile.mkdtemp(prefix="kvfleet-tier-bench-"))
    files = disk_files.DiskFiles(folder / "tier", {"full": b"bench"})
    plain_dir = folder / "plain"
    plain_dir.mkdir(parents=True, exist_ok=True)
    n = args.disk_pages
    payload = bytearray(os.urandom(page_bytes))
    buffer = memoryview(bytearray(page_bytes))

    def tier_write():
        for block in range(n):
            files.write("full", block, payload)

    def plain_write():
        for block in range(n):
            with open(plain_dir / f"{block}.bin", "wb") as out:
                out.write(payload)

    def tier_read():
        for block in range(n):
            if not files.read_into("full", block, buffer):
                raise SystemExit(f"block {block} did not read back")

    def plain_read():
        for block in range(n):
            with open(plain_dir / f"{block}.bin", "rb") as source:
                source.readinto(buffer)

    total = n * page_bytes
    results = [
        (
            "host -> disk",
            "block files written",
            total,
            seconds(tier_write, torch.device("cpu"), args.reps),
            seconds(plain_write, torch.device("cpu"), args.reps),
        ),
        (
            "disk -> host",
            "block files read (page cache)",
            total,
            seconds(tier_read, torch.device("cpu"), args.reps),
            seconds(plain_read, torch.device("cpu"), args.reps),
        ),
    ]
    if args.disk_dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return results


def print_table(results, device, page_bytes):
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"KV tier copies on {device} ({page_bytes / 2**20:.1f} MiB pages)")
    for column in ("boundary", "path", "MiB", "tier GB/s", "plain GB/s", "tier / plain"):
        table.add_column(column, justify="right")
    for boundary, what, size, tier_s, plain_s in results:
        table.add_row(
            boundary,
            what,
            f"{size / 2**20:.0f}",
            f"{size / tier_s / 1e9:.2f}",
            f"{size / plain_s / 1e9:.2f}",
            f"{plain_s / tier_s:.2f}",
        )
    Console(width=120).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--layers", type=int, default=32 if cuda else 8)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--pages", type=int, default=128 if cuda else 32)
    parser.add_argument("--disk-pages", type=int, default=32 if cuda else 16)
    parser.add_argument("--disk-dir", default=None, help="folder on the volume to measure")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    device = torch.device(args.device)
    mods = import_tiers()
    results, page_bytes = device_host_rows(args, mods, device)
    results += disk_rows(args, mods, page_bytes)
    print_table(results, device, page_bytes)
    offload = next(r for r in results if r[1] == "offload, scattered slots")
    onboard = next(r for r in results if r[1] == "onboard, scattered slots")
    print(
        f"device<->pinned host as a fraction of a plain tensor.copy_: offload "
        f"{offload[4] / offload[3]:.2f}, onboard {onboard[4] / onboard[3]:.2f}"
    )


if __name__ == "__main__":
    main()
