"""Tiny random Hugging Face checkpoints of each supported architecture, written without
transformers: config.json as transformers writes it, sharded safetensors under the names
save_pretrained uses (per-expert tensors for MoE), a byte-level tokenizer.json with ChatML
special tokens, a chat template, and generation_config.json.

They load in the engine and in transformers alike, so a newcomer can serve (and compare) a
real checkpoint layout with no download.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .decoder import CausalLM
from .registry import ARCHITECTURES, model_config_from_hf
from .tokenizer import byte_tokenizer_json
from .weights import build_model, state_tensors

CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML with tools, as Qwen2.5's template writes them: the tools, the <tool_call> syntax the
# model is asked to answer in (so the engine parses its calls as the `hermes` family), earlier
# calls and the tools' results.
CHAT_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role ' + message.role) }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for call in message.tool_calls %}
{{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' }}
{{- (call.function.arguments if call.function.arguments is string
     else call.function.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + (message.content or '') }}
{{- '\\n</tool_response><|im_end|>\\n' }}
{%- elif message.role != 'system' or not loop.first %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

_SHAPE = {
    "vocab_size": 320,  # 256 bytes + the special tokens, padded
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
_ARCH_FIELDS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
    },
    "MistralForCausalLM": {"model_type": "mistral", "sliding_window": 64, "head_dim": 16},
    "Qwen2ForCausalLM": {
        "model_type": "qwen2",
        "use_sliding_window": True,
        "sliding_window": 64,
        "max_window_layers": 2,
    },
    "Qwen3ForCausalLM": {"model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
    "Qwen3MoeForCausalLM": {
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "MixtralForCausalLM": {
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rope_theta": 1e6,
    },
    "GptOssForCausalLM": {  # layers 0 and 2 slide a 64-token window, layer 1 is full
        "model_type": "gpt_oss",
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 64,
        "attention_bias": True,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 8.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 512,
        },
    },
    "GraniteMoeHybridForCausalLM": {  # Mamba-2 at 0 and 2, attention at 1
        "model_type": "granitemoehybrid",
        "layer_types": ["mamba", "attention", "mamba"],
        "mamba_n_heads": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "shared_intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "position_embedding_type": "rope",
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 2.0,
        "attention_multiplier": 0.25,
    },
    "Qwen3NextForCausalLM": {  # linear attention at 0 and 2, gated attention at 1
        "model_type": "qwen3_next",
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "head_dim": 32,
        "partial_rotary_factor": 0.25,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}
_EXPERT_NAMES = {  # architecture -> (MLP prefix, gate, up, down) as save_pretrained writes
    "Qwen3MoeForCausalLM": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "Qwen3NextForCausalLM": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "MixtralForCausalLM": ("block_sparse_moe", "w1", "w3", "w2"),
}


def tiny_hf_config(arch: str, dtype: str = "bfloat16") -> dict[str, Any]:
    """config.json of a tiny `arch` (transformers 4 layout, which transformers 5 reads too)."""
    if arch not in _ARCH_FIELDS:
        raise ValueError(f"--arch: unknown {arch!r}; supported: {sorted(ARCHITECTURES)}")
    return {"architectures": [arch], **_SHAPE, **_ARCH_FIELDS[arch], "torch_dtype": dtype,
            "bos_token_id": None, "eos_token_id": 258}  # fmt: skip


def hf_state_dict(model: CausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors under save_pretrained's names (tied head once, experts one by one)."""
    config = model.config
    state = state_tensors(model)
    if config.tie_embeddings:
        state.pop("lm_head.weight")
    if config.architecture == "GraniteMoeHybridForCausalLM":
        return _granite_names(state)
    if config.architecture == "Qwen3NextForCausalLM":
        state = _conv1d_names(state)
    if config.architecture not in _EXPERT_NAMES:
        return state
    mlp, gate, up, down = _EXPERT_NAMES[config.architecture]
    i = config.moe_intermediate_size
    for layer in config.moe_layers:
        ours = f"model.layers.{layer}.mlp"
        theirs = f"model.layers.{layer}.{mlp}"
        state[f"{theirs}.gate.weight"] = state.pop(f"{ours}.gate.weight")
        gate_up, down_proj = (
            state.pop(f"{ours}.experts.gate_up_proj"),
            state.pop(f"{ours}.experts.down_proj"),
        )
        for e in range(config.num_experts):
            state[f"{theirs}.experts.{e}.{gate}.weight"] = gate_up[e, :i].clone()
            state[f"{theirs}.experts.{e}.{up}.weight"] = gate_up[e, i:].clone()
            state[f"{theirs}.experts.{e}.{down}.weight"] = down_proj[e].clone()
    return state


def _granite_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Granite's hub names: Mamba's conv as nn.Conv1d `[C, 1, K]`, the experts' older names."""
    out = {}
    for name, tensor in state.items():
        name = name.replace(".experts.gate_up_proj", ".input_linear.weight")
        name = name.replace(".experts.down_proj", ".output_linear.weight")
        name = name.replace(".router.weight", ".router.layer.weight")
        out[name.replace(".conv_bias", ".conv1d.bias")] = tensor
    return _conv1d_names(out)


def _conv1d_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A recurrent layer's conv as the hub stores it: nn.Conv1d's `conv1d.weight [C, 1, K]`."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".conv_weight"):
            name, tensor = name.replace(".conv_weight", ".conv1d.weight"), tensor[:, None]
        out[name] = tensor.contiguous()
    return out


def write_tiny_checkpoint(
    path: str | Path, arch: str, seed: int = 0, dtype: str = "bfloat16", shard: str = "100KB"
) -> Path:
    """Write a tiny random `arch` checkpoint with tokenizer and chat template into `path`."""
    from huggingface_hub import save_torch_state_dict

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    data = tiny_hf_config(arch, dtype)
    config = model_config_from_hf(data, path.name).with_changes(init_std=0.08)
    model = build_model(config, seed=seed, dtype=getattr(torch, dtype))
    save_torch_state_dict(hf_state_dict(model), path, max_shard_size=shard)
    (path / "config.json").write_text(json.dumps(data, indent=2))
    (path / "tokenizer.json").write_text(byte_tokenizer_json(CHATML_TOKENS))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": config.max_position,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    generation = {"eos_token_id": [258, 256], "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path
