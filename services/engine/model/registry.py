"""Supported architectures, keyed by `config.json`'s `architectures`, each with its reader.

A reader turns the config into ModelConfig fields the way transformers' modeling code reads
it (which keys mean what, their defaults, which layers slide a window, which are MoE).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config.model_config import ModelConfig
from .hf_keys import ConfigError, KeyReader, read_rope

Reader = Callable[[KeyReader], dict[str, Any]]


def _dense(r: KeyReader, max_position: int, eps: float, theta: float = 10000.0) -> dict:
    act = r.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{r.architecture}: hidden_act {act!r} is not supported; supported: silu")
    heads = int(r.require("num_attention_heads"))
    hidden = int(r.require("hidden_size"))
    max_pos = int(r.get("max_position_embeddings", max_position))
    theta, scaling = read_rope(r, theta, max_pos)
    if scaling is not None and scaling.kind == "dynamic":
        # Dynamic NTK exists to run past the trained context; serve up to factor times it.
        max_pos = int(max_pos * scaling.factor)
    return {
        "vocab_size": int(r.require("vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(r.require("intermediate_size")),
        "num_layers": int(r.require("num_hidden_layers")),
        "num_heads": heads,
        "num_kv_heads": int(r.get("num_key_value_heads", heads)),
        "head_dim": int(r.get("head_dim", hidden // heads)),
        "max_position": max_pos,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": float(r.get("rms_norm_eps", eps)),
        "tie_embeddings": bool(r.get("tie_word_embeddings", False)),
    }


def _window(fields: dict, layers: list[int], size: int | None) -> dict:
    if size and layers:
        fields.update(window_layers=tuple(layers), window_size=int(size))
    return fields


def _qwen_window_layers(r: KeyReader, num_layers: int) -> tuple[list[int], int | None]:
    """Qwen2/3: `layer_types` when given, else layers >= max_window_layers slide when
    use_sliding_window (transformers 5's reading)."""
    size, use = r.get("sliding_window"), r.get("use_sliding_window", False)
    size = size if use else None
    types = r.get("layer_types")
    max_window = int(r.get("max_window_layers", num_layers))
    if types is None:
        return ([i for i in range(num_layers) if i >= max_window] if size else []), size
    bad = sorted(set(types) - {"full_attention", "sliding_attention"})
    if bad or len(types) != num_layers:
        raise ConfigError(
            f"{r.architecture}: layer_types must list {num_layers} of "
            f"full_attention/sliding_attention, got {types}"
        )
    layers = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if layers and not r.get("sliding_window"):
        raise ConfigError(f"{r.architecture}: sliding_attention layers need sliding_window")
    return layers, r.get("sliding_window")


def _llama(r: KeyReader) -> dict:
    fields = _dense(r, 2048, 1e-6)
    bias = bool(r.get("attention_bias", False))
    return {**fields, "qkv_bias": bias, "o_bias": bias, "mlp_bias": bool(r.get("mlp_bias", False))}


def _mistral(r: KeyReader) -> dict:
    fields = _dense(r, 131072, 1e-6)
    return _window(fields, list(range(fields["num_layers"])), r.get("sliding_window"))


def _qwen2(r: KeyReader) -> dict:
    fields = {**_dense(r, 32768, 1e-6), "qkv_bias": True}
    return _window(fields, *_qwen_window_layers(r, fields["num_layers"]))


def _qwen3(r: KeyReader) -> dict:
    fields = _dense(r, 32768, 1e-6)
    bias = bool(r.get("attention_bias", False))
    fields.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    return _window(fields, *_qwen_window_layers(r, fields["num_layers"]))


def _experts(r: KeyReader, fields: dict, count_key: str) -> dict:
    experts = int(r.require(count_key))
    top_k = int(r.require("num_experts_per_tok"))
    if not 0 < top_k <= experts:
        raise ConfigError(f"{r.architecture}: num_experts_per_tok {top_k} not in 1..{experts}")
    return {**fields, "num_experts": experts, "num_experts_per_tok": top_k}


def _qwen3_moe(r: KeyReader) -> dict:
    fields = _dense(r, 32768, 1e-6)
    bias = bool(r.get("attention_bias", False))
    fields.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    count_key = "num_experts" if r.data.get("num_experts") is not None else "num_local_experts"
    r.accept("num_experts", "num_local_experts")
    fields = _experts(r, fields, count_key)
    step = int(r.get("decoder_sparse_step", 1))
    dense_only = set(r.get("mlp_only_layers", []))
    n = fields["num_layers"]
    fields["moe_layers"] = tuple(i for i in range(n) if i not in dense_only and (i + 1) % step == 0)
    fields["moe_intermediate_size"] = int(r.require("moe_intermediate_size"))
    fields["norm_topk_prob"] = bool(r.get("norm_topk_prob", False))
    # Written by some Qwen3-MoE checkpoints (Qwen3-Coder), read by no transformers code.
    r.expect("qkv_bias", bias)
    r.expect("use_qk_norm", True)
    r.expect("shared_expert_intermediate_size", 0)
    # Qwen3-MoE slides the window on every layer when use_sliding_window (max_window_layers
    # is read by Qwen2/3 only).
    r.accept("max_window_layers")
    size, use = r.get("sliding_window"), r.get("use_sliding_window", False)
    size = size if use else None
    return _window(fields, list(range(n)), size)


def _mixtral(r: KeyReader) -> dict:
    fields = _experts(r, _dense(r, 131072, 1e-5, theta=1e6), "num_local_experts")
    n = fields["num_layers"]
    fields.update(
        moe_layers=tuple(range(n)),
        moe_intermediate_size=fields["intermediate_size"],
        norm_topk_prob=True,  # Mixtral always renormalises the top-k weights
    )
    return _window(fields, list(range(n)), r.get("sliding_window"))


def _layer_types(r: KeyReader, num_layers: int, default: list[str]) -> list[int]:
    """The sliding layers that `layer_types` (else `default`) names."""
    types = r.get("layer_types") or default
    bad = sorted(set(types) - {"full_attention", "sliding_attention"})
    if bad or len(types) != num_layers:
        raise ConfigError(
            f"{r.architecture}: layer_types must list {num_layers} of "
            f"full_attention/sliding_attention, got {types}"
        )
    return [i for i, t in enumerate(types) if t == "sliding_attention"]


def _gpt_oss(r: KeyReader) -> dict:
    # transformers' GptOssConfig defaults: theta 150000, YaRN x32 over 4096 (untruncated).
    if r.data.get("rope_parameters") is None and r.data.get("rope_scaling") is None:
        r.data = {**r.data, "rope_parameters": dict(GPT_OSS_ROPE)}
    fields = _experts(r, _dense(r, 131072, 1e-5, theta=150000.0), "num_local_experts")
    n, bias = fields["num_layers"], bool(r.get("attention_bias", True))
    fields.update(
        qkv_bias=bias,
        o_bias=bias,
        attention_sinks=True,
        experts_kind="gpt_oss",
        moe_layers=tuple(range(n)),
        moe_intermediate_size=fields["intermediate_size"],
        swiglu_alpha=float(r.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(r.get("swiglu_limit", 7.0)),
    )
    # Even layers slide, odd layers attend to everything, unless layer_types says otherwise.
    default = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    # An absent sliding_window is transformers' default, 128; a null one means no window.
    size = r.get("sliding_window") if "sliding_window" in r.data else 128
    return _window(fields, _layer_types(r, n, default), size)


def _json_float(value: Any) -> float:
    """A float of config.json; transformers 5 writes infinities as {"__float__": "Infinity"}."""
    return float(value["__float__"] if isinstance(value, dict) else value)


# Granite's layer kinds, in transformers 5's names and the hub configs' older ones.
_GRANITE_SSM, _GRANITE_ATTENTION = {"linear_attention", "mamba"}, {"full_attention", "attention"}


def _granite_hybrid(r: KeyReader) -> dict:
    fields = _dense(r, 2048, 1e-6)
    n, hidden = fields["num_layers"], fields["hidden_size"]
    r.accept("layer_types", "layers_block_type")
    types = r.data.get("layer_types") or r.data.get("layers_block_type") or ["mamba"] * n
    bad = sorted(set(types) - _GRANITE_SSM - _GRANITE_ATTENTION)
    if bad or len(types) != n:
        raise ConfigError(
            f"{r.architecture}: layer_types must list {n} of mamba/attention, got {types}"
        )
    if int(r.get("mamba_n_groups", 1)) != 1:
        raise ConfigError(
            f"{r.architecture}: mamba_n_groups {r.get('mamba_n_groups')} is not supported; "
            "supported: 1"
        )
    heads, expand = int(r.get("mamba_n_heads", 128)), int(r.get("mamba_expand", 2))
    head_dim = r.get("mamba_d_head", "auto")
    head_dim = expand * hidden // heads if head_dim == "auto" else int(head_dim)
    if heads * head_dim != expand * hidden:
        raise ConfigError(
            f"{r.architecture}: mamba_n_heads * mamba_d_head != mamba_expand * hidden_size"
        )
    limit = [_json_float(v) for v in r.get("time_step_limit", (0.0, float("inf")))]
    if limit != [0.0, float("inf")]:
        raise ConfigError(
            f"{r.architecture}: time_step_limit {limit} is not supported; supported: [0.0, inf]"
        )
    r.expect("mamba_conv_bias", True)
    r.expect("mamba_proj_bias", False)
    r.accept("mamba_chunk_size")  # how the scan is cut, not what it computes
    position = r.get("position_embedding_type")
    if position not in (None, "rope"):
        raise ConfigError(
            f"{r.architecture}: position_embedding_type {position!r} is not supported; "
            "supported: None, 'rope'"
        )
    bias = bool(r.get("attention_bias", False))
    fields.update(
        qkv_bias=bias,
        o_bias=bias,
        use_rope=position == "rope",
        # intermediate_size is the experts' width; the shared MLP has its own.
        intermediate_size=int(r.get("shared_intermediate_size", 1024)),
        ssm_layers=tuple(i for i, t in enumerate(types) if t in _GRANITE_SSM),
        ssm_num_heads=heads,
        ssm_head_dim=head_dim,
        ssm_state_size=int(r.get("mamba_d_state", 256)),
        ssm_conv_kernel=int(r.get("mamba_d_conv", 4)),
        embedding_multiplier=float(r.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(r.get("residual_multiplier", 1.0)),
        logits_scaling=float(r.get("logits_scaling", 1.0)),
        attention_scale=float(r.get("attention_multiplier", 1.0)),
    )
    if int(r.get("num_local_experts", 8)) > 0:
        fields = _experts(r, fields, "num_local_experts")
        fields.update(moe_layers=tuple(range(n)), norm_topk_prob=True,
                      moe_intermediate_size=int(r.require("intermediate_size")))  # fmt: skip
    else:
        r.accept("num_experts_per_tok")
    return fields


def _qwen3_next(r: KeyReader) -> dict:
    # partial_rotary_factor: at the top (transformers 4's configs) or in rope_parameters
    # (transformers 5's); transformers defaults it to 0.25.
    data, rope = dict(r.data), dict(r.data.get("rope_parameters") or {})
    factor = rope.pop("partial_rotary_factor", data.pop("partial_rotary_factor", None))
    if "rope_parameters" in data:
        data["rope_parameters"] = rope or None
    r.data = data
    r.accept("partial_rotary_factor")
    fields = _dense(r, 32768, 1e-6)
    n, head_dim = fields["num_layers"], int(r.get("head_dim", 256))
    rotary = int(head_dim * float(0.25 if factor is None else factor))
    if rotary <= 0 or rotary % 2:
        raise ConfigError(
            f"{r.architecture}: partial_rotary_factor {factor} gives {rotary} rotary dims of "
            f"{head_dim}; supported: an even number, at least 2"
        )
    interval = int(r.get("full_attention_interval", 4))  # read only when layer_types is absent
    types = r.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
    ]
    if sorted(set(types) - {"linear_attention", "full_attention"}) or len(types) != n:
        raise ConfigError(
            f"{r.architecture}: layer_types must list {n} of linear_attention/full_attention, "
            f"got {types}"
        )
    if len(set(types)) != 2:
        raise ConfigError(
            f"{r.architecture}: layer_types {types} is not supported; supported: at least one "
            "linear_attention and one full_attention layer"
        )
    key_heads = int(r.get("linear_num_key_heads", 16))
    value_heads = int(r.get("linear_num_value_heads", 32))
    if value_heads % key_heads:
        raise ConfigError(
            f"{r.architecture}: linear_num_value_heads {value_heads} is not a multiple of "
            f"linear_num_key_heads {key_heads}"
        )
    r.expect("use_sliding_window", False)  # written by the hub configs, read by no code
    bias = bool(r.get("attention_bias", False))
    fields.update(
        head_dim=head_dim,
        rotary_dim=rotary,
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,  # zero-centred (model/qwen3_next.py)
        ssm_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
        ssm_num_heads=value_heads,
        ssm_head_dim=int(r.get("linear_value_head_dim", 128)),
        ssm_num_groups=key_heads,
        ssm_state_size=int(r.get("linear_key_head_dim", 128)),
        ssm_conv_kernel=int(r.get("linear_conv_kernel_dim", 4)),
    )
    if int(r.get("num_experts", 512)) <= 0:
        r.accept("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")  # fmt: skip
        return fields
    fields = _experts(r, fields, "num_experts")
    step, dense_only = int(r.get("decoder_sparse_step", 1)), set(r.get("mlp_only_layers", []))
    shared = int(r.get("shared_expert_intermediate_size", 512))
    if shared <= 0:
        raise ConfigError(
            f"{r.architecture}: shared_expert_intermediate_size {shared} is not supported; "
            "supported: a positive width"
        )
    fields.update(
        moe_layers=tuple(i for i in range(n) if i not in dense_only and (i + 1) % step == 0),
        moe_intermediate_size=int(r.get("moe_intermediate_size", 512)),
        shared_expert_intermediate_size=shared,
        norm_topk_prob=bool(r.get("norm_topk_prob", True)),
    )
    return fields


GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}

ARCHITECTURES: dict[str, Reader] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _mistral,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "MixtralForCausalLM": _mixtral,
    "GptOssForCausalLM": _gpt_oss,
    "GraniteMoeHybridForCausalLM": _granite_hybrid,
    "Qwen3NextForCausalLM": _qwen3_next,
}


def model_config_from_hf(data: dict[str, Any], name: str = "checkpoint") -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json; ConfigError for anything unsupported."""
    archs = data.get("architectures") or []
    if len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise ConfigError(
            f"architectures {archs!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    reader = KeyReader(data, archs[0])
    reader.accept("architectures")
    fields = ARCHITECTURES[archs[0]](reader)
    reader.check_all_read()
    return ModelConfig(**fields, architecture=archs[0], name=name)
