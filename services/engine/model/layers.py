"""Building blocks of the decoder: RMSNorm, SwiGLU, attention projections, decoder layers.

Parameter names follow the Hugging Face checkpoints (Llama, Qwen: `self_attn.q_proj`,
`mlp.gate_proj`, `mlp.experts.gate_up_proj`, ...), so that their tensors load by name;
`weights.py` maps the few older layouts (per-expert tensors, Mixtral's names) onto these.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config.model_config import ModelConfig
from . import decode_matmul
from .decode_matmul import Linear
from .fused import fusable
from .gpt_oss_moe import GptOssMoE
from .moe import SparseMoE
from .packed import PackedLinear
from .rope import apply_rope, rope_angles

__all__ = ["AttentionProjections", "DecoderLayer", "RMSNorm", "SwiGLU", "apply_rope", "rope_angles"]

# (packed q/k/v [T, (H + 2 KVH) D], rope, heads) -> rotated q, its k and v stored; or None
# where nothing was stored (kv/rope_store.py).
StoreRotated = Callable[[torch.Tensor, tuple[torch.Tensor, torch.Tensor], int], torch.Tensor | None]

# ModelConfig.experts_kind -> the MoE block of that flavour.
MOE_BLOCKS: dict[str, type[nn.Module]] = {"swiglu": SparseMoE, "gpt_oss": GptOssMoE}


class RMSNorm(nn.Module):
    """x / rms(x) * weight: normalised in fp32, cast back, then scaled (as transformers does)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, this norm of it): a residual add and the norm after it, one kernel."""
        return add_rms_norm(x, delta, self.weight, self.eps)


@fusable
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm's math (one fused kernel on CUDA: fused.py)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


@fusable
def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after an add, and its RMSNorm (one fused kernel on CUDA)."""
    total = x + delta
    return total, rms_norm.unfused(total, weight, eps)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), `intermediate_size` wide unless `size` says otherwise."""

    def __init__(self, config: ModelConfig, size: int | None = None) -> None:
        super().__init__()
        h, i, bias = config.hidden_size, size or config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = Linear(i, h, bias=bias)
        self.gate_up_proj: PackedLinear | None = None  # pack()

    def pack(self) -> None:
        """gate and up as one matmul (packed.py); once."""
        if self.gate_up_proj is None:
            self.gate_up_proj = PackedLinear([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            packed = self.gate_up_proj
            activated = decode_matmul.silu_gated_linear(x, packed.weight, packed.bias)
            if activated is not None:
                return self.down_proj(activated)
            gate, up = packed(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(silu_mul(gate, up))


@fusable
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (one fused kernel on CUDA: fused.py)."""
    return F.silu(gate) * up


class AttentionProjections(nn.Module):
    """q/k/v/o projections, per-head q/k norms (Qwen3), RoPE and per-head sink logits (gpt-oss)
    of one layer; the attention itself is a backend's job."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = Linear(config.num_heads * d, h, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.sinks = nn.Parameter(torch.empty(config.num_heads)) if config.attention_sinks else None
        self.qkv_proj: PackedLinear | None = None  # pack()

    def pack(self) -> None:
        """q, k and v as one matmul (packed.py); once."""
        if self.qkv_proj is None:
            self.qkv_proj = PackedLinear([self.q_proj, self.k_proj, self.v_proj])

    def qkv(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        store: StoreRotated | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Rotated q `[T, H, D]`, rotated k and v `[T, KVH, D]` of tokens `x [T, hidden]`
        (not rotated when `rope` is None: a model without positional embeddings). With
        `store`, which may rotate and store k and v itself (one kernel): q alone, k and v
        None, where it did."""
        heads, kv_heads, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is None:
            q = self.q_proj(x).view(-1, heads, d)
            k = self.k_proj(x).view(-1, kv_heads, d)
            v = self.v_proj(x).view(-1, kv_heads, d)
        else:
            packed = self.qkv_proj(x)
            if self.q_norm is None and rope is not None:
                q = store(packed, rope, heads) if store is not None else None
                if q is not None:
                    return q, None, None
            # q's and k's heads side by side, as the packed matmul writes them
            qk, v = packed.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
            qk, v = qk.view(-1, heads + kv_heads, d), v.view(-1, kv_heads, d)
            if self.q_norm is None and rope is not None:
                qk = apply_rope(qk, rope)  # one rotation for q and k together
                return qk[:, :heads], qk[:, heads:], v
            q, k = qk[:, :heads], qk[:, heads:]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is None:
            return q, k, v
        return apply_rope(q, rope), apply_rope(k, rope), v


class DecoderLayer(nn.Module):
    """Pre-norm attention block then pre-norm MLP block (SwiGLU or experts), each residual."""

    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = AttentionProjections(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        moe = MOE_BLOCKS[config.experts_kind]
        self.mlp = moe(config) if config.is_moe_layer(layer) else SwiGLU(config)


def pack_projections(model: nn.Module) -> nn.Module:
    """Pack every layer's q/k/v and gate/up into one matmul each (packed.py), once the
    weights are loaded and placed; returns `model`."""
    for module in list(model.modules()):
        if isinstance(module, (AttentionProjections, SwiGLU)):
            module.pack()
    if torch.cuda.is_available():
        # The unpacked weights' memory goes back to the device for the KV pool, whose size
        # was reckoned from the free memory before the weights and their size.
        torch.cuda.empty_cache()
    return model
