"""q/k/v and gate/up packed into one matmul each: the same model, the checkpoint's names kept,
and the per-projection parameters still the weights the matmul reads."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import small_config
from kvfleet.services.engine.model.classes import model_class
from kvfleet.services.engine.model.layers import RMSNorm, pack_projections, rms_norm
from kvfleet.services.engine.model.packed import PackedLinear
from kvfleet.services.engine.model.weights import build_model
from torch import nn

PROMPT = torch.tensor([3, 9, 27, 17, 51, 25, 11, 33, 35, 41, 59, 49])


def _unpacked_copy(model: nn.Module) -> nn.Module:
    """The same weights in a model that was never packed."""
    copy = model_class(model.config)(model.config).eval().requires_grad_(False)
    copy.load_state_dict(model.state_dict())
    return copy


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "qkv-bias"])
def test_a_packed_model_computes_what_the_unpacked_one_does(bias):
    model = build_model(small_config(qkv_bias=bias), seed=5)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_proj is not None and mlp.gate_up_proj is not None
    plain = _unpacked_copy(model)
    assert plain.model.layers[0].self_attn.qkv_proj is None
    torch.testing.assert_close(model.forward_dense(PROMPT), plain.forward_dense(PROMPT))


def test_packing_keeps_the_checkpoints_names():
    """A saved packed model is the checkpoint it was loaded from: no packed tensors in it."""
    model = build_model(small_config(), seed=5)
    names = set(model.state_dict())
    assert names == set(_unpacked_copy(model).state_dict())
    assert not any("qkv_proj" in name or "gate_up_proj" in name for name in names)


def test_writing_a_projections_weight_reaches_the_packed_matmul():
    """Loaders and tests write parameters in place: the packed weight must see it."""
    model = build_model(small_config(), seed=5)
    layer = model.model.layers[1]
    with torch.no_grad():
        layer.self_attn.v_proj.weight.mul_(-3.0)
        layer.mlp.up_proj.weight.add_(0.25)
    torch.testing.assert_close(
        model.forward_dense(PROMPT), _unpacked_copy(model).forward_dense(PROMPT)
    )


def test_packing_twice_changes_nothing():
    model = build_model(small_config(), seed=5)
    packed = model.model.layers[0].self_attn.qkv_proj
    pack_projections(model)
    assert model.model.layers[0].self_attn.qkv_proj is packed


def test_projections_with_and_without_bias_are_refused():
    with pytest.raises(ValueError, match="all have a bias or all have none"):
        PackedLinear([nn.Linear(4, 2, bias=True), nn.Linear(4, 3, bias=False)])


def test_the_add_and_norm_is_the_residual_sum_and_its_norm():
    norm = RMSNorm(16, 1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, delta = torch.randn(2, 3, 16).unbind()
    total, normed = norm.add(x, delta)
    assert torch.equal(total, x + delta)
    assert torch.equal(normed, rms_norm(x + delta, norm.weight, 1e-5))
