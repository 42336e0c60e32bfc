"""Attention backends over the paged KV cache, picked from a small registry.

Every backend computes, for each new token of each sequence, causal attention over the
sequence's cached plus new keys (read from its pages), restricted to the last `window`
positions (the query's own included) when `window` is set. With `sinks` (one learned logit per
query head, gpt-oss), each query's softmax has one more column, the head's sink logit, whose
value is zero: the weights of the real keys then sum to less than one. Pages of an fp8 cache
come with `kv_scales` (each `[kv_heads]`, kv_quant.py): a backend reads `stored * scale`, and
the sink column is added after that dequantization.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .attn_flash import FlashAttention, flash_supports
from .attn_reference import ReferenceAttention
from .attn_sdpa import SdpaAttention
from .batch import AttentionMetadata


class AttentionBackend(Protocol):
    """Paged attention: `q [T, heads, head_dim]` -> output of the same shape."""

    name: str

    def forward(
        self,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
        sinks: torch.Tensor | None = None,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention of the new queries over their sequences' pages (reads only); `kv_scales`:
        the K and V scales of fp8 pages (None: the pages hold the values themselves)."""
        ...


@dataclass(frozen=True)
class BackendEntry:
    """How to make a backend and whether it can run on a device."""

    factory: Callable[..., AttentionBackend]
    supports: Callable[[torch.device], bool]


def _any_device(_device: torch.device) -> bool:
    return True


# The backends import nothing of this module, so it can import them all here.
BACKENDS: dict[str, BackendEntry] = {
    "flash": BackendEntry(factory=FlashAttention, supports=flash_supports),
    "reference": BackendEntry(factory=ReferenceAttention, supports=_any_device),
    "sdpa": BackendEntry(factory=SdpaAttention, supports=_any_device),
}

# Preference order of the automatic pick on each device type.
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "cuda": ("flash", "sdpa", "reference"),
    "cpu": ("reference", "sdpa"),
}


def available_backends(device: torch.device | str) -> list[str]:
    """Names of the registered backends that can run on `device`."""
    device = torch.device(device)
    return [name for name, entry in BACKENDS.items() if entry.supports(device)]


def make_backend(
    name: str | None, device: torch.device | str, **options: object
) -> AttentionBackend:
    """The backend `name` (or the best available when None or "auto") for `device`."""
    device = torch.device(device)
    if name in (None, "auto"):
        order = AUTO_ORDER.get(device.type, ("reference",))
        name = next(n for n in order if n in BACKENDS and BACKENDS[n].supports(device))
    entry = BACKENDS.get(name)
    if entry is None:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}")
    if not entry.supports(device):
        raise ValueError(f"attention backend {name!r} cannot run on device {device}")
    return entry.factory(**options)
