"""Weights: deterministic init from a seed, and saving the engine's own checkpoints.

Hugging Face checkpoints (single or sharded safetensors) load through `checkpoint.py`.

The seeded init draws every weight from a counter-based hash (splitmix64 of the element index,
keyed by the seed and the parameter's name) in integer arithmetic, which CPU and CUDA compute
bit for bit alike; so one seed gives the same weights on any device, and an 8B-shaped model
initialises on the GPU in seconds instead of on the CPU in minutes.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from ..config.model_config import ModelConfig
from . import checkpoint
from .classes import model_class
from .decoder import CausalLM
from .layers import pack_projections

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_CHUNK = 1 << 24  # elements hashed at a time, to bound the int64 scratch memory

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    # int64 products wrap modulo 2**64 on CPU and CUDA alike.
    x = x + _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_MIX1)
    x = (x ^ _shr(x, 27)) * _signed(_MIX2)
    return x ^ _shr(x, 31)


def _splitmix_int(value: int) -> int:
    z = (value + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def hashed_uniform(numel: int, seed: int, stream: str, device: torch.device | str) -> torch.Tensor:
    """fp32 values in [-1, 1), a pure function of (seed, stream, element index)."""
    key = _signed(_splitmix_int((seed << 32) ^ zlib.crc32(stream.encode())))
    out = torch.empty(numel, dtype=torch.float32, device=device)
    for start in range(0, numel, _CHUNK):
        index = torch.arange(start, min(start + _CHUNK, numel), dtype=torch.int64, device=device)
        bits = _shr(_splitmix(index + key), 40)  # top 24 bits: exact in fp32
        out[start : start + index.numel()] = bits.to(torch.float32) * (2.0 / (1 << 24)) - 1.0
    return out


@torch.no_grad()
def init_weights(model: CausalLM, seed: int) -> None:
    """Fill `model` in place: norms with ones, every matrix uniform with std `init_std`."""
    bound = model.config.init_std * 3**0.5
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        values = hashed_uniform(param.numel(), seed, name, param.device) * bound
        param.copy_(values.view(param.shape))


def build_model(
    config: ModelConfig,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CausalLM:
    """A model with seeded random weights, allocated directly on `device` in `dtype` (a
    hybrid SSM/attention model when the config names `ssm_layers`)."""
    with torch.device("meta"):
        model = model_class(config)(config)
    model = model.to_empty(device=device)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    init_weights(model, seed)
    if config.ssm_layers:
        with torch.no_grad():
            model.reset_ssm_parameters()
    return pack_projections(model.to(dtype).eval().requires_grad_(False))


def state_tensors(model: CausalLM) -> dict[str, torch.Tensor]:
    """The state dict on the CPU, each tensor a copy of its own: packed projections are views
    of one weight (packed.py), and safetensors refuses tensors that share storage."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}


def save_checkpoint(model: CausalLM, directory: str | Path) -> Path:
    """Write `config.json` and `model.safetensors` (tied LM head stored once) into `directory`."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = state_tensors(model)
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2))
    return directory


def load_checkpoint(
    directory: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> CausalLM:
    """A local checkpoint: ours (`save_checkpoint`) or a Hugging Face one (checkpoint.py)."""
    return checkpoint.load_checkpoint(directory, device, dtype)


def config_from_file(path: str | Path) -> ModelConfig:
    """The ModelConfig of our `config.json` or of a Hugging Face one (`architectures`)."""
    return checkpoint.config_from_dict(json.loads(Path(path).read_text()), Path(path).parent.name)
