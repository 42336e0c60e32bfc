"""What each model preset's rank asks for as device KV, under a stated device memory.

    python3 bench/kv_budget_table.py                       # an H200 and a CPU host
    python3 bench/kv_budget_table.py --gpu-total-mib 81559 # an 80 GB GPU

Nothing is allocated: the budget and the pools are computed as a rank computes them, from
`mem_get_info`-like figures given here (so it runs on a machine without a GPU).
"""

from __future__ import annotations

import argparse

import torch
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.model_config import PRESETS, preset
from kvfleet.services.engine.kv.kv_budget import GIB, DeviceMemory, kv_budget
from kvfleet.services.engine.kv.kv_setup import build_kv, kvstore_config

MIB = 1 << 20


def row(name: str, config: EngineConfig, device: str, memory: DeviceMemory) -> list[str]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = preset(name)
    budget = kv_budget(model, config, torch.device(device), memory, dtype)
    kv = build_kv(model, config, dtype, budget)
    peak = kvstore_config(model, config)

    def size(pages) -> float:
        return sum(n * kv.layout.page_bytes(p) for p, n in pages.items()) / GIB

    used, needed = size(kv.store_config.pool_pages), size(peak.pool_pages)
    return [
        name,
        device,
        f"{budget.budget_bytes / GIB:.1f}",
        f"{needed:.1f}",
        f"{used:.1f}",
        str(sum(kv.store_config.pool_pages.values())),
        "yes" if used >= needed else "no",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-total-mib", type=int, default=143771, help="default: an H200")
    parser.add_argument("--gpu-in-use-mib", type=int, default=600, help="CUDA context etc.")
    parser.add_argument("--host-free-gib", type=float, default=256.0)
    parser.add_argument("--max-batch-size", type=int, default=8)
    args = parser.parse_args()
    gpu = DeviceMemory((args.gpu_total_mib - args.gpu_in_use_mib) * MIB, args.gpu_total_mib * MIB)
    host = DeviceMemory(int(args.host_free_gib * GIB), int(2 * args.host_free_gib * GIB))
    header = ["model", "device", "budget GiB", "peak GiB", "asks GiB", "pages", "holds peak"]
    rows = [header]
    for name in sorted(PRESETS):
        config = EngineConfig(model=name, max_batch_size=args.max_batch_size)
        rows += [row(name, config, "cuda", gpu), row(name, config, "cpu", host)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print(
        f"GPU: {args.gpu_total_mib} MiB total, {args.gpu_in_use_mib} MiB in use; "
        f"host: {args.host_free_gib:g} GiB free; max_batch_size {args.max_batch_size}"
    )
    for r in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
