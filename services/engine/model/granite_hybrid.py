"""Granite 4.0 hybrid (`GraniteMoeHybridForCausalLM`): Mamba-2 layers beside attention layers.

Each layer is pre-norm mixer (`mamba`: the selective SSM of `ssm.py`, one B/C group, a gated
RMSNorm over the whole width; or `self_attn`), then pre-norm `shared_mlp` (one SwiGLU whose
`input_linear` holds the gate rows then the up rows) plus, when the model has experts,
`block_sparse_moe` (softmax over the top-k router logits, SwiGLU experts). Both residual
branches are scaled by `residual_multiplier`; the embeddings by `embedding_multiplier`; the
logits divided by `logits_scaling`; attention scores scaled by `attention_multiplier`
instead of 1/sqrt(head_dim); RoPE only when `position_embedding_type` is "rope".

The paged forward (K/V pages for attention, the `ssm` state pool's snapshots for the Mamba
layers) is `HybridLM`'s: only the layers' parts and the multipliers differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config.model_config import ModelConfig
from .hybrid import AttendFn, HybridLM, MixFn
from .layers import AttentionProjections, RMSNorm
from .moe import Experts, route
from .rope import rope_angles
from .ssm import SelectiveSSM, SSMShape


class GraniteSharedMLP(nn.Module):
    """output_linear(silu(gate) * up), gate and up the two halves of `input_linear`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.input_linear = nn.Linear(h, 2 * i, bias=False)
        self.output_linear = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(gate) * up)


class GraniteMoE(nn.Module):
    """`router` (no bias; softmax over the top-k logits) then the chosen SwiGLU experts."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.router(x), self.top_k, norm_topk_prob=True)
        return self.experts(x, weights, experts)


class GraniteHybridLayer(nn.Module):
    """Pre-norm `mamba` or `self_attn`, then pre-norm shared MLP (+ experts)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.is_ssm_layer(layer):
            self.mamba = SelectiveSSM(SSMShape.of(config))
        else:
            self.self_attn = AttentionProjections(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.shared_mlp = GraniteSharedMLP(config)
        if config.is_moe_layer(layer):
            self.block_sparse_moe = GraniteMoE(config)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shared_mlp(x)
        if hasattr(self, "block_sparse_moe"):
            out = self.block_sparse_moe(x) + out
        return out


class GraniteHybridStack(nn.Module):
    """Embedding, layers, final norm (`model.*`, as the checkpoints name them)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GraniteHybridLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class GraniteHybridLM(HybridLM):
    """`HybridLM`'s paged forward over Granite's layers and multipliers."""

    stack_class = GraniteHybridStack

    @property
    def _scale(self) -> float:
        return self.config.attention_scale or self.config.head_dim**-0.5

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return (self.lm_head(hidden) / self.config.logits_scaling).float()

    def _run_layers(
        self, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn, mix: MixFn
    ) -> torch.Tensor:
        c = self.config
        hidden = self.model.embed_tokens(token_ids) * c.embedding_multiplier
        rope = rope_angles(positions, c) if c.use_rope else None
        for index, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(hidden)
            if hasattr(layer, "mamba"):
                mixed = mix(index, layer.mamba, x)
            else:
                q, k, v = layer.self_attn.qkv(x, rope)
                mixed = layer.self_attn.o_proj(attend(index, q, k, v).flatten(1))
            hidden = hidden + mixed * c.residual_multiplier
            out = layer.mlp(layer.post_attention_layernorm(hidden))
            hidden = hidden + out * c.residual_multiplier
        return self.model.norm(hidden)
