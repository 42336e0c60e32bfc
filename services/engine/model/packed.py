"""Linear projections of one input packed into one matmul: q/k/v, and gate/up.

A decode step's matmuls read every weight once for a few rows, so their speed is the copy
bandwidth each kernel reaches; a 1,024-row k or v projection of an 8b model reads 8 MB, too
little to fill the GPU, and every launch leaves a tail. Packed, a layer's q/k/v and gate/up
run as two matmuls where they ran five.

The packed weight is the storage: each projection's parameters become views into it, so
checkpoints keep their names (state_dict, saving, tensor-parallel shards) and in-place writes
(`copy_`) reach the matmul. Pack after the weights are loaded and placed: moving the module
(`.to`) afterwards copies the views apart, which stays correct (the forward reads the packed
buffer) but holds the weights twice.
"""

from __future__ import annotations

import torch
from torch import nn

from . import decode_matmul


class PackedLinear(nn.Module):
    """`linears` of one input as one matmul; `forward` returns their outputs side by side, in
    order, along the last dimension (each `out_features` wide)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        biases = [linear.bias for linear in linears]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("packed projections must all have a bias or all have none")
        with torch.no_grad():
            weight = torch.cat([linear.weight for linear in linears])
            bias = None if biases[0] is None else torch.cat(biases)
        start = 0
        for linear in linears:
            size = linear.out_features
            linear.weight.data = weight[start : start + size]
            if bias is not None:
                linear.bias.data = bias[start : start + size]
            start += size
        # Buffers, not parameters: the state dict keeps the checkpoint's names only.
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return decode_matmul.linear(x, self.weight, self.bias)
