"""An fp8 cache's scales, calibrated once at start-up from the model itself.

One dense forward of a fixed pseudo-random prompt gives each layer's largest |K| and |V| per
KV head; each scale is the power of two that leaves `CALIBRATION_HEADROOM` over it (kv_quant).
The prompt is fixed and the scales are powers of two, so every pod of a fleet with the same
checkpoint computes the same scales; a pod that did not reads other pods' disk blocks as misses
(the scales' tag is in the layout fingerprint), never as wrong values.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .kv_quant import KVScales, power_of_two_scale

CALIBRATION_TOKENS = 512
CALIBRATION_SEED = 0


def calibration_prompt(vocab_size: int, device: torch.device) -> torch.Tensor:
    """The fixed prompt every pod calibrates on."""
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    ids = torch.randint(0, vocab_size, (CALIBRATION_TOKENS,), generator=generator)
    return ids.to(device)


def calibrate_kv_scales(
    model: torch.nn.Module, groups: Mapping[str, tuple[int, ...]], device: torch.device
) -> KVScales:
    """Per layer group `[layers, 2, kv_heads]` power-of-two scales from `model.kv_amax` (unit
    scales for a model without it: the hybrid SSM models)."""
    kv_amax = getattr(model, "kv_amax", None)
    if kv_amax is None:
        return KVScales.ones(groups, model.config.num_kv_heads)
    amax = kv_amax(calibration_prompt(model.config.vocab_size, device))
    scales = power_of_two_scale(amax)
    return KVScales({group: scales[list(layers)] for group, layers in groups.items()})
