"""Attention sinks on the GPU: the flash backend (sinkless kernel, output rescaled by
sigmoid(lse - sink)) and SDPA (zero key with the sink as a mask column) against the fp32
reference with sinks, in bf16, on gpt-oss's head shape. Prints one table; fails over 2e-2.

    python bench/gpu/sinks_check.py      # on the device machine, after bench/gpu/run.sh unpack
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_attention_bench import CORRECTNESS_CASES, Shape, random_paged
from gpu_common import import_engine, print_table

GPT_OSS = Shape("gpt-oss", 64, 8, 64)


def main() -> int:
    engine = import_engine()
    device = torch.device("cuda")
    backends = [n for n in ("flash", "sdpa") if n in engine.available_backends(device)]
    reference = engine.make_backend("reference", device)
    sinks = torch.randn(GPT_OSS.heads, device=device, generator=None) * 2
    rows, worst = [], 0.0
    for page_size in (128, 16):
        for case, (spec, window) in CORRECTNESS_CASES.items():
            cache, meta, q = random_paged(
                engine, spec, GPT_OSS, page_size, window, device, torch.bfloat16
            )
            k, v = cache.kv(0)
            scale = GPT_OSS.head_dim**-0.5
            ref = reference.forward(q.float(), k.float(), v.float(), meta, window, scale, sinks)
            plain = reference.forward(q.float(), k.float(), v.float(), meta, window, scale)
            row = [page_size, case, float((plain - ref).norm() / ref.norm())]
            for name in backends:
                out = engine.make_backend(name, device).forward(
                    q, k, v, meta, window, scale, sinks.to(q.dtype)
                )
                err = float((out.float() - ref).norm() / ref.norm())
                worst = max(worst, err)
                row.append(err)
            rows.append(row)
    print_table(
        "attention with sinks vs fp32 reference (relative error, bf16; 'no sinks': how far the "
        "sinkless output is)",
        ["page", "case", "no sinks", *backends],
        rows,
    )
    return 0 if worst <= 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
