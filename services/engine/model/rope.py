"""Rotary position embedding with the scaling rules Hugging Face defines (linear, dynamic NTK,
YaRN, Llama 3), computed on the positions' device with tensor ops only (no host syncs), so a
forward that uses it can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch

from ..config.model_config import ModelConfig, RopeScaling
from .fused import fusable


def _default_inv_freq(theta: float, dim: int, device: torch.device) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (theta**exponents)


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between blended.
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(s: RopeScaling) -> float:
    """YaRN's factor on cos and sin (the attention temperature)."""
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return _yarn_mscale(s.factor, s.mscale) / _yarn_mscale(s.factor, s.mscale_all_dim)
    return _yarn_mscale(s.factor)


def _yarn(theta: float, dim: int, s: RopeScaling, device: torch.device) -> torch.Tensor:
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(theta)
        )

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoids a division by zero, as HF does
    pos_freqs = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)
    ramp = torch.arange(dim // 2, device=device, dtype=torch.float32)
    ramp = ((ramp - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def _dynamic_angles(positions: torch.Tensor, theta: float, dim: int, s: RopeScaling):
    # The base of a sequence that ends at each token (HF's dynamic NTK at that length).
    length = torch.clamp(positions + 1, min=s.original_max_position).to(torch.float32)
    base = theta * ((s.factor * length / s.original_max_position) - (s.factor - 1)) ** (
        dim / (dim - 2)
    )
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim
    inv_freq = 1.0 / (base[:, None] ** exponents[None, :])
    return positions.to(torch.float32)[:, None] * inv_freq


def rope_angles(positions: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[tokens, 1, rotary_dim // 2]` of each position (computed once per forward;
    rotary_dim is head_dim unless the config rotates only part of each head)."""
    dim, theta, s = config.rotary_dim or config.head_dim, config.rope_theta, config.rope_scaling
    scale = 1.0
    if s is not None and s.kind == "dynamic":
        angles = _dynamic_angles(positions, theta, dim, s)
    else:
        inv_freq = _default_inv_freq(theta, dim, positions.device)
        if s is not None and s.kind == "linear":
            inv_freq = inv_freq / s.factor
        elif s is not None and s.kind == "llama3":
            inv_freq = _llama3(inv_freq, s)
        elif s is not None and s.kind == "yarn":
            inv_freq = _yarn(theta, dim, s, positions.device)
            scale = yarn_attention_factor(s)
        angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos[:, None, :], sin[:, None, :]


@fusable  # one kernel on CUDA instead of about ten (fused.py)
def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate `x [tokens, heads, head_dim]` by `rope_angles` (halves layout, as Llama does);
    with partial rotary (angles narrower than the head) only the first dims, the rest pass.

    cos/sin are cast to x's dtype first and the rotation runs in that dtype, as transformers
    does, so that bf16 models round the same way.
    """
    cos, sin = (t.to(x.dtype) for t in rope)
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
