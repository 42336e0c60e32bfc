"""The selective SSM's scan: resuming from a stored state equals scanning through it."""

from __future__ import annotations

import pytest
import torch
from kvfleet.services.engine.config import preset
from kvfleet.services.engine.models.ssd_scan import run_ends
from kvfleet.services.engine.models.ssm import SelectiveSSM, SSMShape, SSMState


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


def test_runs_cover_the_tokens_in_chunks():
    """A run longer than the chunk would build an [L, L] matrix of any length."""
    assert run_ends(150) == [64, 128, 150]
    assert run_ends(10) == [10]
    assert run_ends(128, chunk_tokens=64) == [64, 128]
