"""Seeded weights are deterministic; safetensors checkpoints round-trip exactly."""

from __future__ import annotations

import json

import pytest
import torch
from engine_helpers import small_config
from kvfleet.services.engine.model.weights import (
    build_model,
    config_from_file,
    hashed_uniform,
    load_checkpoint,
    save_checkpoint,
)


def test_same_seed_gives_identical_weights():
    """Two ranks built from one seed must hold the same model."""
    a = build_model(small_config(), seed=11).state_dict()
    b = build_model(small_config(), seed=11).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_different_seeds_give_different_weights():
    """A seed that is ignored would make every test model the same."""
    a = build_model(small_config(), seed=1).state_dict()["model.layers.0.mlp.up_proj.weight"]
    b = build_model(small_config(), seed=2).state_dict()["model.layers.0.mlp.up_proj.weight"]
    assert not torch.equal(a, b)


def test_hashed_uniform_is_a_function_of_index_not_of_chunking():
    """Values must not depend on how many are drawn, or shapes would change the weights."""
    long = hashed_uniform(1000, seed=3, stream="w", device="cpu")
    short = hashed_uniform(10, seed=3, stream="w", device="cpu")
    assert torch.equal(long[:10], short)
    assert float(long.min()) >= -1.0 and float(long.max()) < 1.0
    assert abs(float(long.mean())) < 0.1
    assert not torch.equal(short, hashed_uniform(10, seed=3, stream="other", device="cpu"))


def test_init_std_matches_config():
    """Weights far off init_std would make the random model's activations blow up or vanish."""
    model = build_model(small_config(hidden_size=256, intermediate_size=512), seed=0)
    std = float(model.model.layers[0].mlp.up_proj.weight.std())
    assert std == pytest.approx(0.02, rel=0.05)
    assert torch.equal(model.model.norm.weight, torch.ones(256))


@pytest.mark.parametrize("tied", [False, True])
def test_safetensors_round_trip(tmp_path, tied):
    """A saved and reloaded model must produce bit-identical logits."""
    model = build_model(small_config(tie_embeddings=tied), seed=5)
    save_checkpoint(model, tmp_path)
    loaded = load_checkpoint(tmp_path)
    tokens = torch.arange(20) % 64
    assert torch.equal(model.forward_dense(tokens), loaded.forward_dense(tokens))
    assert loaded.config == model.config
    if tied:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_checkpoint_with_missing_tensor_is_refused(tmp_path):
    """A truncated checkpoint must fail loudly instead of running on garbage weights."""
    from safetensors.torch import load_file, save_file

    save_checkpoint(build_model(small_config(), seed=5), tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\]"):
        load_checkpoint(tmp_path)


def test_hugging_face_llama_config_is_understood(tmp_path):
    """A local Llama checkpoint's config.json must map onto our fields."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": 128,
                "hidden_size": 64,
                "intermediate_size": 96,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 256,
                "rope_theta": 500000.0,
                "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True,
            }
        )
    )
    config = config_from_file(path)
    assert (config.num_layers, config.num_kv_heads, config.head_dim) == (2, 2, 16)
    assert config.tie_embeddings and config.rope_theta == 500000.0
