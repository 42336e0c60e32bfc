"""The selective SSM's scan: resuming from a stored state equals scanning through it."""

from __future__ import annotations

import torch
from kvfleet.services.engine.config import preset
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
