"""Run under TRITON_INTERPRET=1 (tests/engine/test_decode_matmul.py starts it): the decode
matmul kernel against fp32 math, at every row count it takes, split and unsplit, with a bias,
a ragged last column block and a strided weight view; twice per split shape, since each call
must leave the arrival counters ready for the next; gated (`silu(gate) * up` of a packed
gate/up weight) against fp32 math; the dispatch of `linear` and `silu_gated_linear`; and the
tiling rule against the sweep's picks on the H100."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from kvfleet.services.engine.model import decode_matmul
from kvfleet.services.engine.model.decode_matmul_kernel import MatmulShape
from kvfleet.services.engine.model.decode_matmul_kernel import decode_matmul as kernel
from kvfleet.services.engine.model.packed import PackedLinear

REPO = Path(__file__).resolve().parents[2]


def worst(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias) -> float:
    want = x.float() @ w.float().T + (0 if bias is None else bias.float())
    return float((got.float() - want).abs().max() / want.abs().max())


def check_shape_rule(failures: list) -> None:
    """`shape_for`'s rule gives the tilings the H100 sweep picked for the 8b's shapes."""
    swept = json.loads((REPO / "bench/gpu/decode_matmul_shapes_h100.json").read_text())
    multiprocessors = decode_matmul.multiprocessors
    decode_matmul.multiprocessors = lambda device: 132  # the H100 SXM's
    decode_matmul.shape_for.cache_clear()
    try:
        for entry in swept:
            cols, inner = entry.pop("cols"), entry.pop("inner")
            got = decode_matmul.shape_for(cols, inner, torch.device("cpu"))
            print(f"shape_for({cols}, {inner}): {got}")
            if got != MatmulShape(**entry):
                failures.append(("shape_for", cols, inner, got, entry))
    finally:
        decode_matmul.multiprocessors = multiprocessors
        decode_matmul.shape_for.cache_clear()


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    failures = []
    check_shape_rule(failures)
    cases = [  # rows, cols, inner, shape, bias
        (1, 128, 256, MatmulShape(block_n=64, block_k=128), False),
        (5, 100, 256, MatmulShape(block_n=64, block_k=64, split_k=2), True),
        (16, 192, 512, MatmulShape(block_n=32, block_k=128, split_k=4), False),
        (33, 64, 256, MatmulShape(block_n=64, block_k=64, split_k=4), True),
        (64, 96, 128, MatmulShape(block_n=32, block_k=64, split_k=1), True),
    ]
    for rows, cols, inner, shape, with_bias in cases:
        x = torch.randn(rows, inner, generator=gen).to(torch.bfloat16)
        full = torch.randn(cols + 8, inner, generator=gen).to(torch.bfloat16)
        w = full[8:]  # a view into a larger weight, as a packed projection's part is
        bias = torch.randn(cols, generator=gen).to(torch.bfloat16) if with_bias else None
        for call in range(2):
            error = worst(kernel(x, w, bias, shape), x, w, bias)
            print(f"rows {rows} cols {cols} inner {inner} {shape} call {call}: {error:.2e}")
            if error > 2e-2:
                failures.append((rows, cols, shape, call, error))
    # gated: silu(gate) * up of the packed gate/up rows, split and unsplit, twice each.
    for rows, half, inner, shape, with_bias in [
        (3, 96, 256, MatmulShape(block_n=64, block_k=128), True),
        (64, 64, 512, MatmulShape(block_n=32, block_k=64, split_k=4), False),
    ]:
        x = torch.randn(rows, inner, generator=gen).to(torch.bfloat16)
        w = torch.randn(2 * half, inner, generator=gen).to(torch.bfloat16)
        bias = torch.randn(2 * half, generator=gen).to(torch.bfloat16) if with_bias else None
        gate, up = (x.float() @ w.float().T + (0 if bias is None else bias.float())).chunk(2, -1)
        want = F.silu(gate) * up
        for call in range(2):
            got = kernel(x, w, bias, shape, silu_gated=True)
            error = float((got.float() - want).abs().max() / want.abs().max())
            print(f"gated rows {rows} half {half} inner {inner} {shape} call {call}: {error:.2e}")
            if got.shape != (rows, half) or error > 2e-2:
                failures.append(("gated", rows, half, shape, call, error))
    # linear: the kernel where it takes the call, F.linear everywhere else.
    decode_matmul.enable(True)
    w = torch.randn(256, 512, generator=gen).to(torch.bfloat16)
    for rows in (3, 64, 65):
        x = torch.randn(rows, 512, generator=gen).to(torch.bfloat16)
        shape = decode_matmul.shape_for(256, 512, x.device)
        want = kernel(x, w, None, shape) if rows <= 64 else F.linear(x, w)
        same = torch.equal(decode_matmul.linear(x, w, None), want)
        print(f"linear rows {rows}: {'kernel' if rows <= 64 else 'F.linear'}'s result: {same}")
        if not same:
            failures.append(("linear", rows))
    # silu_gated_linear: the gated kernel where it takes the call, None (the caller's two
    # steps) past the row bound or with the gate switched off.
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    shape = decode_matmul.shape_for(256, 512, x.device)
    same = torch.equal(
        decode_matmul.silu_gated_linear(x, w, None), kernel(x, w, None, shape, silu_gated=True)
    )
    many = torch.randn(65, 512, generator=gen).to(torch.bfloat16)
    declined = decode_matmul.silu_gated_linear(many, w, None) is None
    decode_matmul.enable(True, silu_gated=False)
    declined = declined and decode_matmul.silu_gated_linear(x, w, None) is None
    decode_matmul.enable(True)
    print(f"silu_gated_linear: the gated kernel's result {same}; declines the rest {declined}")
    if not (same and declined):
        failures.append(("silu_gated_linear", same, declined))
    parts = [torch.nn.Linear(512, n, bias=True).to(torch.bfloat16) for n in (128, 64, 64)]
    packed = PackedLinear(parts)
    x = torch.randn(2, 4, 512, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        got = packed(x)
    want = torch.cat([F.linear(x.float(), p.weight.float(), p.bias.float()) for p in parts], -1)
    error = float((got.float() - want.detach()).abs().max() / want.abs().max())
    print(f"packed [2, 4, 512] -> {list(got.shape)}: {error:.2e}")
    if got.shape != (2, 4, 256) or error > 2e-2:
        failures.append(("packed", error))
    if failures:
        print("FAILED", failures)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
