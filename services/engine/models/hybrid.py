"""A hybrid decoder: some layers a selective SSM (`ssm.py`), the rest full attention.

Each layer is pre-norm mixer (attention or SSM) then pre-norm SwiGLU, each residual. Attention
layers keep K/V per token (the `full` life cycle); SSM layers keep one recurrent state, stored
as snapshots at block boundaries (the `state` life cycle). `forward_chunk` runs a chunk of one
sequence from its cached K/V and states, so a prefix-cache hit and a recompute run the same
code from different starting points.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..attn_reference import dense_attention
from ..config import ModelConfig
from ..layers import AttentionProjections, RMSNorm, SwiGLU
from .rope import rope_angles
from .ssm import SelectiveSSM, SSMShape, SSMState

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class HybridConfig:
    """`base` gives vocab, widths, attention heads and RoPE; `ssm_layers` are recurrent."""

    base: ModelConfig
    ssm_layers: tuple[int, ...]
    ssm: SSMShape

    def __post_init__(self) -> None:
        bad = [i for i in self.ssm_layers if not 0 <= i < self.base.num_layers]
        if bad:
            raise ValueError(f"ssm_layers {bad} outside 0..{self.base.num_layers - 1}")
        if self.ssm.hidden_size != self.base.hidden_size:
            raise ValueError(
                f"ssm.hidden_size {self.ssm.hidden_size} != hidden_size {self.base.hidden_size}"
            )
        if self.base.window_layers:
            raise ValueError("hybrid attention layers are full attention (no window_layers)")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.base.num_layers) if i not in self.ssm_layers)


@dataclass
class ChunkOutput:
    """Logits of each new token, their K/V per attention layer, the SSM states after the
    chunk, and the states after each token asked for (per SSM layer, by chunk index)."""

    logits: torch.Tensor
    kv: dict[int, KV]
    states: dict[int, SSMState]
    kept: dict[int, dict[int, SSMState]] = field(default_factory=dict)


class HybridLayer(nn.Module):
    def __init__(self, config: HybridConfig, layer: int) -> None:
        super().__init__()
        base = config.base
        self.input_layernorm = RMSNorm(base.hidden_size, base.rms_norm_eps)
        is_ssm = layer in config.ssm_layers
        self.mixer = SelectiveSSM(config.ssm) if is_ssm else AttentionProjections(base)
        self.post_attention_layernorm = RMSNorm(base.hidden_size, base.rms_norm_eps)
        self.mlp = SwiGLU(base)


class HybridLM(nn.Module):
    """Embedding, hybrid layers, final norm, LM head."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        base = config.base
        self.config = config
        self.embed_tokens = nn.Embedding(base.vocab_size, base.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(config, i) for i in range(base.num_layers))
        self.norm = RMSNorm(base.hidden_size, base.rms_norm_eps)
        self.lm_head = nn.Linear(base.hidden_size, base.vocab_size, bias=False)

    def initial_states(self) -> dict[int, SSMState]:
        device = self.embed_tokens.weight.device
        return {layer: SSMState.zeros(self.config.ssm, device) for layer in self.config.ssm_layers}

    @torch.inference_mode()
    def forward_chunk(
        self,
        token_ids: torch.Tensor,
        start: int,
        past_kv: dict[int, KV],
        states: dict[int, SSMState],
        keep_after: frozenset[int] = frozenset(),
    ) -> ChunkOutput:
        """Tokens at positions `start..` after `past_kv` (`[start, kv_heads, head_dim]` per
        attention layer) and `states` (per SSM layer, after token start-1)."""
        base = self.config.base
        positions = torch.arange(start, start + token_ids.numel(), device=token_ids.device)
        rope = rope_angles(positions, base)
        hidden = self.embed_tokens(token_ids)
        out = ChunkOutput(logits=torch.empty(0), kv={}, states={})
        for index, layer in enumerate(self.layers):
            x = layer.input_layernorm(hidden)
            if isinstance(layer.mixer, SelectiveSSM):
                mixed, out.states[index], out.kept[index] = layer.mixer(
                    x, states[index], keep_after
                )
            else:
                q, k, v = layer.mixer.qkv(x, rope)
                out.kv[index] = (k, v)
                past_k, past_v = past_kv[index]
                keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
                attn = dense_attention(q, keys, values, positions, None, base.head_dim**-0.5)
                mixed = layer.mixer.o_proj(attn.flatten(1))
            hidden = hidden + mixed
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        out.logits = self.lm_head(self.norm(hidden)).float()
        return out


def hybrid_tiny() -> HybridConfig:
    """Four layers, SSM at 0 and 2, attention at 1 and 3; the byte vocab of the `tiny` preset."""
    base = ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=4096,
        name="hybrid-tiny",
        architecture="HybridSSMForCausalLM",
    )
    return HybridConfig(base, ssm_layers=(0, 2), ssm=SSMShape(hidden_size=64))


def hybrid_8b() -> HybridConfig:
    """An 8b-class shape (Llama-3-8B widths), three SSM layers to each attention layer, for the
    GPU bench. Its state (537k floats a layer) does not fit an attention-shaped page, so
    `HybridRunner` refuses it: serving it needs state pages of their own shape."""
    base = ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position=32768,
        rope_theta=500000.0,
        name="hybrid-8b",
        architecture="HybridSSMForCausalLM",
    )
    ssm = SSMShape(hidden_size=4096, num_heads=64, head_dim=64, state_size=128)
    return HybridConfig(base, tuple(i for i in range(32) if i % 4 != 3), ssm)
