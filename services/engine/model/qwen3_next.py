"""Qwen3-Next (`Qwen3NextForCausalLM`): gated delta rule layers beside gated attention layers.

Each layer is pre-norm mixer then pre-norm MLP, each residual:

- `linear_attn` (`gated_delta.py`): the recurrent layers, the `ssm` layer group (the kvstore's
  `state` life cycle: snapshots in state pages, as for the Mamba layers);
- `self_attn`: attention whose `q_proj` gives each head its query and an output gate (the
  attention output is multiplied by sigmoid(gate) before `o_proj`), per-head q/k norms, RoPE on
  the first `rotary_dim` dims of each head (partial rotary); K/V in the `full` group's pages;
- `mlp`: routed experts (softmax router `gate`, top-k, renormalised when `norm_topk_prob`)
  plus a `shared_expert` SwiGLU weighted by sigmoid(`shared_expert_gate`), or one SwiGLU.

Every RMSNorm but the one inside `linear_attn` is zero-centred: it scales by (1 + weight),
computed in fp32 before the cast back. The paged forward is `HybridLM`'s.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config.model_config import ModelConfig
from .gated_delta import DeltaShape, GatedDeltaNet
from .hybrid import AttendFn, HybridLM, MixFn
from .layers import SwiGLU
from .moe import SparseMoE
from .rope import apply_rope, rope_angles


class OffsetRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in fp32, cast back to x's dtype (weights stored around 0)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GatedAttention(nn.Module):
    """q (with its output gate), k, v and o projections and the q/k norms of one layer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.q_proj = nn.Linear(h, 2 * config.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=config.o_bias)
        self.q_norm = OffsetRMSNorm(d, config.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(d, config.rms_norm_eps)

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """Rotated q `[T, H, D]`, rotated k and v `[T, KVH, D]`, and the gate `[T, H * D]`
        (each head's q_proj rows are its query, then its gate)."""
        count = x.shape[0]
        q, gate = self.q_proj(x).view(count, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(count, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(count, self.num_kv_heads, self.head_dim)
        return apply_rope(q, rope), apply_rope(k, rope), v, gate.reshape(count, -1)

    def output(self, attended: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attended.flatten(1) * torch.sigmoid(gate))


class SharedExpertMoE(SparseMoE):
    """The routed experts plus a shared SwiGLU expert gated per token by a sigmoid."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.shared_expert = SwiGLU(config, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


class Qwen3NextLayer(nn.Module):
    """Pre-norm `linear_attn` or `self_attn`, then pre-norm `mlp`."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.is_ssm_layer(layer):
            self.linear_attn = GatedDeltaNet(DeltaShape.of(config))
        else:
            self.self_attn = GatedAttention(config)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SharedExpertMoE(config) if config.is_moe_layer(layer) else SwiGLU(config)


class Qwen3NextStack(nn.Module):
    """Embedding, layers, final norm (`model.*`, as the checkpoints name them)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3NextLayer(config, i) for i in range(config.num_layers))
        self.norm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3NextLM(HybridLM):
    """`HybridLM`'s paged forward over Qwen3-Next's layers."""

    stack_class = Qwen3NextStack

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """After a generic init: the delta layers' dynamics, and the zero-centred norms at 0
        (a scale of 1, as transformers starts them)."""
        for module in self.modules():
            if isinstance(module, GatedDeltaNet):
                module.reset_dynamics()
            elif isinstance(module, OffsetRMSNorm):
                module.weight.zero_()

    def _run_layers(
        self, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn, mix: MixFn
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(token_ids)
        rope = rope_angles(positions, self.config)
        for index, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(hidden)
            if hasattr(layer, "linear_attn"):
                mixed = mix(index, layer.linear_attn, x)
            else:
                q, k, v, gate = layer.self_attn.project(x, rope)
                mixed = layer.self_attn.output(attend(index, q, k, v), gate)
            hidden = hidden + mixed
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.norm(hidden)
