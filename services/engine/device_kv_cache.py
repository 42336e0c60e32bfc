"""The model's view of the tiers' device KV: the `PagedKVCache` interface over `DeviceKV`.

The kvstore tiers own the device tensors (so that offload and onboarding copy the very pages
the model reads); the forward, the batch builder and the hand-off code read and write them
through the same calls as a `PagedKVCache`: `kv`, `write`, `group_of`, `num_pages`,
`page_size`, `null_page_id`. Layer groups are kvstore life cycles of the same names.
"""

from __future__ import annotations

import torch
from kvfleet.kvstore.block_pool import NULL_PAGE, IntegrityError
from kvfleet.kvstore.tiers.device_kv import DeviceKV

from .config import ModelConfig


class DeviceKVCache:
    """K/V pages of every layer, held by the tiers' `DeviceKV`; the null page is never written."""

    def __init__(self, config: ModelConfig, device_kv: DeviceKV) -> None:
        layout = device_kv.layout
        if dict(config.groups) != dict(layout.layers):
            raise ValueError(
                f"model layer groups {dict(config.groups)} != KV layout {dict(layout.layers)}"
            )
        self.config = config
        self.device_kv = device_kv
        self.page_size = layout.page_size
        self.null_page_id = NULL_PAGE
        self.device = device_kv.device
        self.dtype = device_kv.dtype
        self.num_pages = {group: int(device_kv.storage(group).shape[2]) for group in config.groups}

    def group_of(self, layer: int) -> str:
        """Layer group that holds `layer`'s pages."""
        return self.device_kv.layout.layer_slot(layer)[0]

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V page tensors of `layer`, each `[num_pages, page_size, kv_heads, head_dim]`."""
        return self.device_kv.kv_for_layer(layer)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store `k`, `v` `[tokens, kv_heads, head_dim]` at slots `page * page_size + offset`."""
        k_pages, v_pages = self.kv(layer)
        flat_shape = (-1, *k_pages.shape[2:])
        k_pages.view(flat_shape).index_copy_(0, slots, k.to(self.dtype))
        v_pages.view(flat_shape).index_copy_(0, slots, v.to(self.dtype))

    def check_integrity(self) -> None:
        """Raise if the null page was ever written or any page holds a non-finite value.

        Reads every page: for tests and idle-time checks, not for the serving hot path.
        """
        for group in self.config.groups:
            storage = self.device_kv.storage(group)
            null = storage[:, :, self.null_page_id]
            if bool(null.any()):
                raise IntegrityError(
                    f"group {group!r}: null page {self.null_page_id} holds "
                    f"{int(null.count_nonzero())} non-zero values"
                )
            bad = int((~torch.isfinite(storage)).sum())
            if bad:
                raise IntegrityError(f"group {group!r}: {bad} non-finite K/V values")

    def bytes_per_token(self) -> int:
        """KV bytes one token takes over all layers."""
        per_layer = 2 * self.config.num_kv_heads * self.config.head_dim * self.dtype.itemsize
        return per_layer * self.config.num_layers
