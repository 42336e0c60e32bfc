"""gpt-oss's mixture of experts: a router with bias, then clamped-SwiGLU experts with biases.

The router takes the top-k logits and softmaxes over those k (which equals softmax over all
experts renormalised over the chosen k). Each expert computes, with the checkpoint's
interleaved gate/up columns (gate at even, up at odd),

    gate = min(gate, limit);  up = clamp(up, -limit, limit)
    out  = down((up + 1) * gate * sigmoid(alpha * gate)) + down_bias

Weights stay in the checkpoint's layout, `[E, in, out]` (`gate_up_proj [E, hidden, 2I]`,
`down_proj [E, I, hidden]`), which is the layout grouped_mm takes as it is.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config.model_config import ModelConfig
from .moe import dispatch, grouped_linear


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation of interleaved gate/up columns `[rows, 2I]` -> `[rows, I]`."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class GptOssExperts(nn.Module):
    """`num_experts` clamped-SwiGLU MLPs with biases, stacked as the checkpoint stores them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.alpha, self.limit = e, config.swiglu_alpha, config.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.down_proj = nn.Parameter(torch.empty(e, i, h))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        return dispatch(x, weights, experts, self.num_experts, self._mlp)

    def _mlp(self, rows: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        # grouped_linear takes [E, out, in]: the transposed view of [E, in, out].
        gate_up = grouped_linear(rows, self.gate_up_proj.transpose(1, 2), offsets)
        hidden = clamped_swiglu(gate_up + self.gate_up_proj_bias[ids], self.alpha, self.limit)
        out = grouped_linear(hidden, self.down_proj.transpose(1, 2), offsets)
        return out + self.down_proj_bias[ids]


class GptOssMoE(nn.Module):
    """`router` (a linear layer with bias) then the chosen experts, weighted by the router."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=True)
        self.experts = GptOssExperts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, experts = torch.topk(self.router(x), self.top_k, dim=-1)
        weights = torch.softmax(top.float(), dim=-1)
        return self.experts(x, weights, experts)
