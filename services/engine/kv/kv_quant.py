"""FP8 (e4m3) KV pages: quantize on write, dequantize where attention reads.

A layer's K and V each have one fp32 scale per KV head (`KVScales`): the stored value is
`x / scale` rounded to e4m3 (saturated at +-448), the value read back is `stored * scale`.
Scales are powers of two, so scaling itself is exact and only the e4m3 rounding (3 mantissa
bits, about 6 % relative) is lost. The scales are fixed for the life of a fleet: pages move
between tiers and pods as raw bytes, and every reader holds the same scales (the disk tier's
layout fingerprint names them, kvstore/tiers/layout.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# Calibrated scales leave this factor of headroom over the largest value seen (saturation
# beyond it clips rather than overflows).
CALIBRATION_HEADROOM = 4.0


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether pages of `dtype` are quantized (read through scales)."""
    return dtype == FP8_DTYPE


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x [tokens, kv_heads, head_dim]` / `scale [kv_heads]`, saturated, as e4m3."""
    scaled = x.float() / scale[:, None]
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(pages: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 `pages [..., kv_heads, head_dim]` x `scale [kv_heads]`, in `dtype`.

    NOTE: straight in `dtype`, no fp32 copy: e4m3 converts exactly to bf16/fp16/fp32, and a
    power-of-two scale multiplies exactly, so this is the fp32 result at half the traffic."""
    return pages.to(dtype) * scale.to(dtype)[:, None]


def power_of_two_scale(amax: torch.Tensor) -> torch.Tensor:
    """Per head, the smallest power of two s with `amax * CALIBRATION_HEADROOM / s <= 448`
    (1 for a head that was all zeros)."""
    wanted = (amax.float() * CALIBRATION_HEADROOM / FP8_MAX).clamp_min(2.0**-30)
    scale = torch.exp2(torch.ceil(torch.log2(wanted)))
    return torch.where(amax > 0, scale, torch.ones_like(scale))


class KVScales:
    """Per layer group a `[layers, 2 (K, V), kv_heads]` fp32 tensor of scales."""

    def __init__(self, scales: Mapping[str, torch.Tensor]) -> None:
        for group, tensor in scales.items():
            if tensor.dim() != 3 or tensor.shape[1] != 2:
                raise ValueError(
                    f"scales of group {group!r}: shape {tuple(tensor.shape)}, "
                    "want [layers, 2, kv_heads]"
                )
            if not bool((tensor > 0).all()) or not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"scales of group {group!r} must be finite and positive")
        self._scales = {group: tensor.float() for group, tensor in scales.items()}

    @classmethod
    def ones(cls, groups: Mapping[str, tuple[int, ...]], kv_heads: int) -> KVScales:
        """Scale 1 everywhere (stored value = value, saturated at +-448)."""
        return cls({g: torch.ones(len(layers), 2, kv_heads) for g, layers in groups.items()})

    def to(self, device: torch.device) -> KVScales:
        """The same scales on `device`."""
        return KVScales({g: t.to(device) for g, t in self._scales.items()})

    def group(self, group: str) -> torch.Tensor:
        """`[layers, 2, kv_heads]` of one layer group."""
        return self._scales[group]

    def tag(self) -> str:
        """A short digest of every scale: equal tags, equal scales (for the disk fingerprint);
        empty when every scale is 1."""
        if all(bool((t == 1).all()) for t in self._scales.values()):
            return ""
        digest = hashlib.blake2b(digest_size=8)
        for group in sorted(self._scales):
            digest.update(group.encode())
            digest.update(self._scales[group].cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()
