"""Run under TRITON_INTERPRET=1 (tests/engine/test_ssm_step_kernel.py starts it): the in-place
Triton step against the torch step plus its scatter, on rows that stay in their page, move to
a new page, start from the null page, and pad rows that must leave the null page zero."""

from __future__ import annotations

import sys

import torch
from kvfleet.services.engine.model.ssm_step import in_place_step, state_update


def check(heads: int, head_dim: int, state: int, kernel: int, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    inner = heads * head_dim
    conv_dim = inner + 2 * state
    numel = (kernel - 1) * conv_dim + inner * state
    states = torch.randn(12, numel + 5, generator=gen)  # spare floats past the state stay put
    states[0] = 0.0  # the null page
    read = torch.tensor([3, 0, 5, 7, 0, 0])
    write = torch.tensor([3, 4, 6, 8, 0, 0])
    keep = torch.tensor([True, True, True, True, False, False])
    rows = len(read)
    xbc, dt = torch.randn(rows, conv_dim, generator=gen), torch.randn(rows, heads, generator=gen)
    params = (
        torch.randn(conv_dim, kernel, generator=gen),
        torch.randn(conv_dim, generator=gen),
        torch.randn(heads, generator=gen),
        torch.randn(heads, generator=gen),
        torch.randn(heads, generator=gen),
    )
    expected = states.clone()
    y_ref, after = state_update.unfused(expected, read, keep, xbc, dt, *params, state)
    expected[:, :numel].index_copy_(0, write, after)
    got = states.clone()
    y = in_place_step("cpu")(got, read, write, keep, xbc, dt, *params, state)
    assert got[0].abs().max() == 0.0, "a pad row wrote into the null page"
    return max((y - y_ref).abs().max().item(), (got - expected).abs().max().item())


def main() -> int:
    assert in_place_step("cpu"), "run with TRITON_INTERPRET=1 and Triton installed"
    worst = max(
        check(4, 8, 16, 4, seed=1),
        check(3, 20, 12, 4, seed=2),  # head dims past one block, a state size not a power of two
        check(2, 8, 8, 2, seed=3),  # a two-tap conv keeps one input
    )
    print(f"max abs difference {worst:.3g}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
