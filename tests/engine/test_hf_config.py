"""config.json reading: both transformers layouts, and a clear error for whatever is unsupported
(unknown architecture, rope type, key, quantization), never a silently dropped key."""

from __future__ import annotations

import json

import pytest
from hf_testkit import ARCHS, hf_config
from kvfleet.services.engine.models.hf_keys import ConfigError
from kvfleet.services.engine.models.registry import model_config_from_hf

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
