"""Mixture-of-experts MLP: a softmax router picks top-k SwiGLU experts per token.

Dispatch is grouped: the (token, expert) pairs are sorted by expert, and each expert's rows
run as one matmul of a grouped GEMM (`torch.nn.functional.grouped_mm`, no host sync, so a
CUDA graph can capture it). Where grouped_mm does not serve the dtype or device, a loop over
the experts' row ranges does the same arithmetic (and syncs once for the ranges).

Weights are stacked per layer as transformers stores them: `experts.gate_up_proj`
`[E, 2 * I, hidden]` (gate rows first) and `experts.down_proj` `[E, hidden, I]`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config.model_config import ModelConfig

_GROUPED_MM = getattr(F, "grouped_mm", None)


def route(
    logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights `[T, k]` fp32, expert ids `[T, k]`): softmax over all experts in fp32, the top
    k, renormalised over those k when `norm_topk_prob` (Mixtral always does that)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def _grouped_mm_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if _GROUPED_MM is None:
        return False
    aligned = all((size * x.element_size()) % 16 == 0 for size in weight.shape[1:])
    if x.device.type == "cpu":
        return aligned
    return (
        aligned
        and x.device.type == "cuda"
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device)[0] >= 9
    )


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of `x` sorted by expert; expert e's rows end at `offsets[e]`: `x_e @ weight[e].T`."""
    if _grouped_mm_serves(x, weight):
        return _GROUPED_MM(x, weight.transpose(1, 2), offs=offsets)
    out = x.new_empty(x.shape[0], weight.shape[1])
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ weight[expert].T
        start = end
    return out


class Experts(nn.Module):
    """`num_experts` SwiGLU MLPs in two stacked tensors."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.intermediate = e, i
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        return dispatch(x, weights, experts, self.num_experts, self._mlp)

    def _mlp(self, rows: torch.Tensor, offsets: torch.Tensor, _expert_ids) -> torch.Tensor:
        gate, up = grouped_linear(rows, self.gate_up_proj, offsets).chunk(2, dim=-1)
        return grouped_linear(F.silu(gate) * up, self.down_proj, offsets)


# The experts' MLP over rows sorted by expert: (rows, offsets, expert id of each row) -> out.
ExpertMLP = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dispatch(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    num_experts: int,
    mlp: ExpertMLP,
) -> torch.Tensor:
    """Each token's top-k experts' outputs of `mlp`, summed with the router's `weights`."""
    tokens, top_k = experts.shape
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # Rows per expert without bincount (whose CUDA kernel syncs to size its output).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offsets = counts.cumsum(0).to(torch.int32)
    out = mlp(x[order // top_k], offsets, flat[order])
    unsorted = torch.empty_like(out)
    unsorted[order] = out
    per_choice = unsorted.view(tokens, top_k, -1) * weights.to(x.dtype)[..., None]
    return per_choice.sum(dim=1)


class SparseMoE(nn.Module):
    """Router (`gate`, no bias) then the chosen experts, weighted by the router."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.top_k, self.norm_topk_prob)
        return self.experts(x, weights, experts)
