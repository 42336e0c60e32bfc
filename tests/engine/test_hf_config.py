"""config.json reading: both transformers layouts, and a clear error for whatever is unsupported
(unknown architecture, rope type, key, quantization), never a silently dropped key."""

from __future__ import annotations

import json

import pytest
from hf_testkit import ARCHS, hf_config
from kvfleet.services.engine.model.hf_keys import ConfigError
from kvfleet.services.engine.model.registry import model_config_from_hf

pytest.importorskip("transformers")


def _saved(arch: str, **changes) -> dict:
    """config.json as transformers 5 writes it (save_pretrained's diff against defaults)."""
    return json.loads(hf_config(arch, **changes).to_json_string())


def test_transformers_4_layout_reads_like_transformers_5():
    """Hub checkpoints carry rope_theta + rope_scaling + torch_dtype (v4), new ones
    rope_parameters + dtype (v5); both must give the same shape."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    v5 = _saved("LlamaForCausalLM", rope_parameters={**rope, "rope_theta": 500000.0})
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "dtype")}
    v4.update(rope_theta=500000.0, rope_scaling={**rope, "type": rope["rope_type"]},
              torch_dtype="bfloat16")  # fmt: skip
    assert model_config_from_hf(v4) == model_config_from_hf(v5)
    assert model_config_from_hf(v4).rope_scaling.original_max_position == 64


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_key_transformers_writes_is_understood(arch):
    """A key the reader does not know is an error, so each arch's full dump must be read."""
    full = json.loads(hf_config(arch).to_json_string(use_diff=False))
    assert model_config_from_hf(full).architecture == arch


def test_unknown_architecture_names_it_and_lists_the_supported():
    with pytest.raises(ConfigError, match=r"\['GPT2LMHeadModel'\].*LlamaForCausalLM.*Qwen3Moe"):
        model_config_from_hf({**_saved("LlamaForCausalLM"), "architectures": ["GPT2LMHeadModel"]})


def test_unknown_rope_type_names_it_and_lists_the_supported():
    data = _saved("LlamaForCausalLM")
    data["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 1e4}
    with pytest.raises(ConfigError, match=r"'longrope'.*'dynamic', 'linear', 'llama3', 'yarn'"):
        model_config_from_hf(data)


def test_unknown_rope_parameter_is_refused():
    data = _saved("LlamaForCausalLM", rope_parameters={"rope_type": "linear", "factor": 2.0})
    data["rope_parameters"]["low_freq_factor"] = 1.0
    with pytest.raises(ConfigError, match="'linear' does not take \\['low_freq_factor'\\]"):
        model_config_from_hf(data)


def test_attention_bias_on_mistral_is_refused():
    """Mistral has no biases; a config asking for them must not load bias-free weights."""
    with pytest.raises(ConfigError, match=r"MistralForCausalLM: unsupported config key\(s\) "
                                          r"\['attention_bias'\]"):  # fmt: skip
        model_config_from_hf({**_saved("MistralForCausalLM"), "attention_bias": True})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("quantization_config", {"quant_method": "awq"}, "quantized checkpoints"),
        ("hidden_act", "gelu", "hidden_act 'gelu'.*silu"),
        ("some_new_knob", 3, r"\['some_new_knob'\]"),
    ],
)
def test_unsupported_values_are_errors(key, value, message):
    with pytest.raises(ConfigError, match=message):
        model_config_from_hf({**_saved("Qwen3ForCausalLM"), key: value})


def test_qwen2_layer_types_and_max_window_layers_agree():
    """transformers 5 writes layer_types; older configs only use_sliding_window and
    max_window_layers; both readings must pick the same window layers."""
    data = _saved("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
                  max_window_layers=2, num_hidden_layers=4)  # fmt: skip
    assert data["layer_types"][2:] == ["sliding_attention"] * 2
    old = {k: v for k, v in data.items() if k != "layer_types"}
    assert model_config_from_hf(data).window_layers == (2, 3)
    assert model_config_from_hf(old) == model_config_from_hf(data)
    off = {**old, "use_sliding_window": False}
    assert model_config_from_hf(off).window_layers == ()


# Qwen3-Coder-30B-A3B-Instruct's config.json as published (the chart's example fleet serves it).
QWEN3_CODER_30B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5472,
    "max_position_embeddings": 262144, "max_window_layers": 28, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
    "qkv_bias": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.0, "shared_expert_intermediate_size": 0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.52.3",
    "use_cache": True, "use_qk_norm": True, "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


def test_qwen3_coder_30b_a3b_config_is_read():
    """The example fleet's model: 48 MoE layers of 128 experts, top 8, renormalised."""
    config = model_config_from_hf(QWEN3_CODER_30B)
    assert (config.num_layers, config.num_experts, config.num_experts_per_tok) == (48, 128, 8)
    assert config.moe_layers == tuple(range(48)) and config.norm_topk_prob and config.qk_norm
    assert (config.head_dim, config.max_position, config.window_layers) == (128, 262144, ())
    assert config.num_parameters() == pytest.approx(30.5e9, rel=0.01)


@pytest.mark.parametrize(
    ("key", "value"), [("shared_expert_intermediate_size", 1024), ("use_qk_norm", False)]
)
def test_keys_transformers_ignores_must_hold_their_neutral_value(key, value):
    """A shared expert transformers' Qwen3-MoE never builds must not be dropped silently."""
    with pytest.raises(ConfigError, match=f"{key}={value!r} is not supported"):
        model_config_from_hf({**QWEN3_CODER_30B, key: value})


def test_chart_example_fleet_names_a_model_the_engine_reads(tmp_path):
    """The example fleet's engine.yaml must point at a checkpoint layout the engine loads and
    carry model settings the engine reads (not keys it would drop)."""
    from pathlib import Path

    import yaml
    from kvfleet.operator.render_config import engine_config
    from kvfleet.operator.spec import parse_spec
    from kvfleet.services.engine.config.engine_yaml import engine_config_from_dict
    from kvfleet.services.engine.model.weights import config_from_file

    example = Path(__file__).resolve().parents[2] / "charts/kvfleet/examples/fleet.yaml"
    spec = parse_spec(yaml.safe_load(example.read_text())["spec"])
    config = engine_config_from_dict(engine_config(spec, "generation"))
    assert config.model_path == "/models/qwen3-coder-30b-a3b"
    assert (config.dtype, config.max_model_len) == ("bfloat16", 131072)
    # What that directory's config.json says (the published one) reads as a supported model.
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_CODER_30B))
    assert config_from_file(tmp_path / "config.json").max_position >= config.max_model_len
