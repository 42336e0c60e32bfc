"""Loading one worker's shard straight from the safetensors files: each tensor is read through
`safe_open(...).get_slice`, so a worker reads only its rows or columns and the full model is
never materialised anywhere.

Which slice a tensor gives follows its role: column-parallel weights (q/k/v, gate/up, per
expert too) and their biases split along the output rows; row-parallel weights (o_proj,
down_proj) split along the input columns, and their biases live on worker 0 alone (zeros
elsewhere) so the all-reduce adds them once; everything else is replicated.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ...model.checkpoint import checkpoint_dtype, config_from_dict, empty_model, fill_parameters
from ...model.decoder import CausalLM
from ...model.layers import pack_projections
from .sharding import TPLayout, install_all_reduce, shard_config

_COLUMN = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj|w1|w3)\.(weight|bias)$")
_ROW = re.compile(r"\.(o_proj|down_proj|w2)\.(weight|bias)$")
_STACKED_GATE_UP = re.compile(r"\.experts\.gate_up_proj$")
_STACKED_DOWN = re.compile(r"\.experts\.down_proj$")


def _read_shard(piece, key: str, layout: TPLayout) -> torch.Tensor | None:
    """This worker's part of tensor `key` (`piece` is its safetensors slice); None for a
    row-parallel bias on a worker other than 0."""
    shape = piece.get_shape()
    if _STACKED_GATE_UP.search(key):  # [E, 2 * I, hidden], gate rows then up rows
        half = shape[1] // 2
        part = layout.part(half)
        gate = piece[:, part.start : part.stop]
        up = piece[:, half + part.start : half + part.stop]
        return torch.cat([gate, up], dim=1)
    if _STACKED_DOWN.search(key):  # [E, hidden, I]
        part = layout.part(shape[2])
        return piece[:, :, part.start : part.stop]
    if _COLUMN.search(key):
        part = layout.part(shape[0])
        return piece[part.start : part.stop]
    if _ROW.search(key):
        if key.endswith(".bias"):
            return piece[:] if layout.rank == 0 else None
        part = layout.part(shape[1])
        return piece[:, part.start : part.stop]
    return piece[:]


def load_sharded_checkpoint(
    directory: str | Path,
    layout: TPLayout,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> CausalLM:
    """Worker `layout.rank`'s shard of the checkpoint in `directory`, all-reduces installed.

    The model's `config` is the worker's sharded shape; `full_config` the checkpoint's."""
    directory = Path(directory)
    data = json.loads((directory / "config.json").read_text())
    full = config_from_dict(data, directory.name)
    config = shard_config(full, layout)
    dtype = dtype or checkpoint_dtype(data) or torch.float32
    model, params = empty_model(config, dtype, device)
    written = dict.fromkeys(params, 0)
    with torch.no_grad():
        for name, p in params.items():
            if _ROW.search(name) and name.endswith(".bias"):
                p.zero_()  # workers other than 0 add no bias
                written[name] = p.numel() if layout.rank else 0
    fill_parameters(
        directory,
        config,
        params,
        lambda shard, key: _read_shard(shard.get_slice(key), key, layout),
        written=written,
        what=f"checkpoint shard {layout.tag}",
    )
    model.full_config = full
    install_all_reduce(model, layout)
    return pack_projections(model.eval().requires_grad_(False))
