"""The selective SSM's scan: resuming from a stored state equals scanning through it."""

from __future__ import annotations

import pytest
import torch
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.model.ssd_scan import chunk_scan
from kvfleet.services.engine.model.ssm import SelectiveSSM, SSMShape, SSMState


def _layer() -> SelectiveSSM:
    torch.manual_seed(0)
    layer = SelectiveSSM(SSMShape.of(preset("hybrid-tiny")))
    with torch.no_grad():
        for parameter in layer.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.2)
    return layer


def test_a_restored_state_continues_like_the_unbroken_scan():
    """The scan from a snapshot equals the scan through it (the rule snapshots rely on)."""
    layer = _layer()
    x = torch.randn(12, 64)
    whole, end, kept = layer(x, SSMState.zeros(layer.shape), frozenset({4}))
    resumed = SSMState.from_flat(layer.shape, kept[4].flat())
    tail, end_resumed, _ = layer(x[5:], resumed)
    torch.testing.assert_close(tail, whole[5:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(end_resumed.ssm, end.ssm)
    torch.testing.assert_close(end_resumed.conv, end.conv)


def test_state_floats_match_the_config():
    """Page sizing counts `ssm_state_floats`; the state the layer keeps must be that size."""
    config = preset("hybrid-tiny")
    state = SSMState.zeros(SSMShape.of(config))
    assert state.flat().numel() == config.ssm_state_floats == SSMShape.of(config).state_numel


@pytest.mark.parametrize("count", [1, 5, 16, 63, 64, 65, 150])
def test_chunked_scan_equals_the_token_by_token_scan(count):
    """Prefill's chunked (SSD) scan must give the recurrence's outputs, end state and every
    kept snapshot, from a state that is not zero."""
    layer = _layer()
    torch.manual_seed(count)
    _, state, _ = layer(torch.randn(7, 64), SSMState.zeros(layer.shape), chunked=False)
    x = torch.randn(count, 64)
    keep = frozenset(range(3, count, 16)) | frozenset({count - 1})
    ref, ref_end, ref_kept = layer(x, state, keep, chunked=False)
    out, end, kept = layer(x, state, keep, chunked=True)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for got, want in [(end, ref_end), *((kept[i], ref_kept[i]) for i in sorted(keep))]:
        torch.testing.assert_close(got.ssm, want.ssm, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.conv, want.conv)
    assert sorted(kept) == sorted(ref_kept)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, 150, 512])
def test_chunk_size_changes_nothing(chunk_tokens):
    """Padding the last chunk, or passing the state between chunks, done wrong shows at some
    chunk size (one token a chunk, sizes that do not divide the length, one chunk for all)."""
    torch.manual_seed(chunk_tokens)
    count, heads, width, size = 150, 4, 8, 8
    x, b, c = torch.randn(count, heads, width), torch.randn(count, size), torch.randn(count, size)
    dt, h0 = torch.rand(count, heads) * 0.2, torch.randn(heads, width, size)
    decay_rate, skip = -torch.linspace(1.0, 16.0, heads), torch.ones(heads)
    keep = (0, 15, 63, 64, 100, 149)
    want = chunk_scan(x, b, c, dt, decay_rate, skip, h0, keep, chunk_tokens=count)
    got = chunk_scan(x, b, c, dt, decay_rate, skip, h0, keep, chunk_tokens=chunk_tokens)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
    assert sorted(got[2]) == list(keep)
    for t in keep:
        torch.testing.assert_close(got[2][t], want[2][t], rtol=1e-4, atol=1e-5)
