"""Loading local checkpoints: Hugging Face safetensors (one file or sharded with
`model.safetensors.index.json`) or the engine's own layout, shard by shard onto the device.

The model is allocated empty on the target device in the target dtype first; each shard is
then opened with safetensors' `safe_open(device=...)` and its tensors are copied into place
one at a time, so host memory holds about one tensor (the shard is memory-mapped), never the
model. Every parameter element must be written exactly once, and every tensor in the files
must land somewhere (or be a known leftover): else the load fails and names the tensors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config.model_config import ModelConfig
from .classes import model_class
from .decoder import CausalLM
from .layers import pack_projections
from .registry import model_config_from_hf

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Tensors checkpoints carry that inference does not use: RoPE frequencies the model recomputes
# (older checkpoints), Qwen3-Next's multi-token-prediction head (`mtp.*`, which transformers
# does not load either).
_LEFTOVER = re.compile(r".*\.rotary_emb\.inv_freq$|^mtp\.")
# One expert's matrix in the per-expert layouts (Qwen-MoE names, Mixtral's w1/w3/w2).
_EXPERT = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
_GATE, _UP = ("gate_proj", "w1"), ("up_proj", "w3")
# Names older layouts give a tensor -> the name the model uses (Granite's experts as the hub
# stores them; transformers 5 renames them the same way on load).
_RENAMES = (
    (
        re.compile(r"\.block_sparse_moe\.input_linear\.weight$"),
        ".block_sparse_moe.experts.gate_up_proj",
    ),
    (
        re.compile(r"\.block_sparse_moe\.output_linear\.weight$"),
        ".block_sparse_moe.experts.down_proj",
    ),
    (re.compile(r"\.block_sparse_moe\.router\.layer\.weight$"), ".block_sparse_moe.router.weight"),
    (re.compile(r"\.conv1d\.bias$"), ".conv_bias"),
)
# Mamba's depthwise nn.Conv1d weight [C, 1, K]; the SSM keeps it as conv_weight [C, K].
_CONV1D = re.compile(r"^(.*)\.conv1d\.weight$")


def config_from_dict(data: dict[str, Any], name: str = "checkpoint") -> ModelConfig:
    """Hugging Face config (it has `architectures` or `model_type`) or the engine's own."""
    if "architectures" in data or "model_type" in data or "num_hidden_layers" in data:
        return model_config_from_hf(data, name)
    return ModelConfig.from_dict(data)


def checkpoint_dtype(data: dict[str, Any]) -> torch.dtype | None:
    """The dtype config.json names (`torch_dtype`, or `dtype` as transformers 5 writes)."""
    name = data.get("torch_dtype") or data.get("dtype")
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"config.json dtype {name!r} unsupported; supported: {sorted(DTYPES)}")
    return DTYPES[name]


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in the index's order when sharded."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise FileNotFoundError(f"checkpoint {directory}: {INDEX_FILE} lists absent {missing}")
        return [directory / f for f in files]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    raise FileNotFoundError(f"checkpoint {directory}: neither {INDEX_FILE} nor {SINGLE_FILE}")


def _target(name: str, config: ModelConfig, params: dict[str, torch.Tensor]):
    """(parameter, the view of it that tensor `name` fills), or None for a known leftover."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    conv = _CONV1D.match(name)
    if conv and f"{conv.group(1)}.conv_weight" in params:
        return f"{conv.group(1)}.conv_weight", params[f"{conv.group(1)}.conv_weight"].unsqueeze(1)
    if name not in params:
        name = name.replace(".block_sparse_moe.", ".mlp.")  # Mixtral's name of the MLP
    if name in params:
        return name, params[name]
    match = _EXPERT.match(name)
    if match:
        prefix, expert, part = match.group(1), int(match.group(2)), match.group(3)
        if part in _GATE or part in _UP:
            stacked = params.get(f"{prefix}.gate_up_proj")
            if stacked is not None:
                i = config.moe_intermediate_size
                rows = slice(0, i) if part in _GATE else slice(i, 2 * i)
                return f"{prefix}.gate_up_proj", stacked[expert, rows]
        elif f"{prefix}.down_proj" in params:
            return f"{prefix}.down_proj", params[f"{prefix}.down_proj"][expert]
    if _LEFTOVER.match(name) or (config.tie_embeddings and name == "lm_head.weight"):
        return None
    raise ValueError(f"unexpected tensor {name!r}")


def empty_model(
    config: ModelConfig, dtype: torch.dtype, device: torch.device | str
) -> tuple[CausalLM, dict[str, torch.Tensor]]:
    """The model allocated (not initialised) on `device` in `dtype`, and its parameters by name."""
    with torch.device("meta"):
        model = model_class(config)(config).to(dtype)
    model = model.to_empty(device=device)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model, {name: p.data for name, p in model.named_parameters()}


# Reads tensor `key` of an open shard (what this process keeps of it); None: nothing to copy.
ReadTensor = Callable[[Any, str], "torch.Tensor | None"]


def fill_parameters(
    directory: Path,
    config: ModelConfig,
    params: dict[str, torch.Tensor],
    read: ReadTensor,
    open_device: str = "cpu",
    written: dict[str, int] | None = None,
    what: str = "checkpoint",
) -> None:
    """Copy every tensor of the checkpoint's files into `params`, one at a time, through
    `read`; ValueError naming the tensors unless every element is written exactly once.
    `written` holds elements already accounted for (e.g. a bias this process never adds)."""
    from safetensors import safe_open

    written = written if written is not None else dict.fromkeys(params, 0)
    unexpected: list[str] = []
    with torch.no_grad():
        for path in weight_files(directory):
            with safe_open(str(path), framework="pt", device=open_device) as shard:
                for key in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    try:
                        target = _target(key, config, params)
                    except ValueError:
                        unexpected.append(key)
                        continue
                    if target is None:
                        continue
                    name, view = target
                    tensor = read(shard, key)
                    if tensor is None:
                        continue
                    if tuple(tensor.shape) != tuple(view.shape):
                        raise ValueError(
                            f"{key}: {what} shape {tuple(tensor.shape)} != {tuple(view.shape)}"
                        )
                    view.copy_(tensor)
                    written[name] += view.numel()
    missing = sorted(n for n, count in written.items() if count < params[n].numel())
    twice = sorted(n for n, count in written.items() if count > params[n].numel())
    if missing or unexpected or twice:
        raise ValueError(
            f"{what} {directory}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"written twice {twice[:5]}"
        )


def load_checkpoint(
    directory: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> CausalLM:
    """Load the checkpoint in `directory` onto `device` in `dtype` (None: config.json's
    torch_dtype, else fp32)."""
    directory = Path(directory)
    data = json.loads((directory / "config.json").read_text())
    config = config_from_dict(data, directory.name)
    dtype = dtype or checkpoint_dtype(data) or torch.float32
    model, params = empty_model(config, dtype, device)
    onto = torch.device(device)
    if onto.type == "cuda" and onto.index is None:
        onto = torch.device("cuda", torch.cuda.current_device())
    fill_parameters(directory, config, params, lambda shard, key: shard.get_tensor(key), str(onto))
    return pack_projections(model.eval().requires_grad_(False))
