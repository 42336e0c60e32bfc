"""The fusable elementwise pieces: plain torch on CPU, and traceable whole by torch.compile
(what fuses them on CUDA), so an edit that breaks the fusion fails here, not on the GPU."""

from __future__ import annotations

import pytest
import torch
from kvfleet.services.engine.compute.cuda_graphs import zero_pad_rows
from kvfleet.services.engine.model import fused
from kvfleet.services.engine.model.layers import add_rms_norm, rms_norm, silu_mul
from kvfleet.services.engine.model.rope import apply_rope


def _tuple(value):
    return value if isinstance(value, tuple) else (value,)


def _cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 16, generator=g)
    rope = (torch.randn(5, 1, 8, generator=g), torch.randn(5, 1, 8, generator=g))
    valid = torch.tensor([True, False, True, True, False])[:, None, None]
    return [
        (rms_norm, (torch.randn(5, 64, generator=g), torch.randn(64, generator=g), 1e-5)),
        (add_rms_norm, (*torch.randn(2, 5, 64, generator=g), torch.randn(64, generator=g), 1e-5)),
        (silu_mul, (torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g))),
        (apply_rope, (x, rope)),
        (zero_pad_rows, (x, x + 1, valid)),
    ]


@pytest.mark.parametrize("fn,args", _cases(), ids=lambda c: getattr(c, "__name__", ""))
def test_fusable_is_the_plain_function_on_cpu_even_when_enabled(fn, args):
    fused.enable(True)
    try:
        out = fn(*args)
    finally:
        fused.enable(False)
    expected = fn.unfused(*args)
    for got, want in zip(_tuple(out), _tuple(expected), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("fn,args", _cases(), ids=lambda c: getattr(c, "__name__", ""))
def test_fusable_traces_as_one_graph(fn, args):
    """fullgraph=True raises on a graph break (a host sync, a Python branch on values)."""
    torch._dynamo.reset()
    traced = torch.compile(fn.unfused, backend="eager", fullgraph=True, dynamic=True)
    out, expected = traced(*args), fn.unfused(*args)
    for got, want in zip(_tuple(out), _tuple(expected), strict=True):
        torch.testing.assert_close(got, want)


def test_pad_rows_are_zero_and_real_rows_untouched():
    k = torch.randn(3, 2, 4)
    valid = torch.tensor([True, False, True])[:, None, None]
    out_k, out_v = zero_pad_rows(k, k * 2, valid)  # stacked [2, T, ...]: unbinds as a pair
    assert torch.equal(out_k[1], torch.zeros(2, 4)) and torch.equal(out_v[1], torch.zeros(2, 4))
    assert torch.equal(out_k[[0, 2]], k[[0, 2]]) and torch.equal(out_v[[0, 2]], 2 * k[[0, 2]])
