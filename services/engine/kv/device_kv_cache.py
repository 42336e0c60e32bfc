"""The model's view of the tiers' device KV: a `PagedKVCache` over `DeviceKV`'s tensors.

The kvstore tiers own the device tensors (so that offload and onboarding copy the very pages
the model reads); the forward, the batch builder and the hand-off code read and write them
through the same calls as any `PagedKVCache`. Layer groups are kvstore life cycles of the same
names.
"""

from __future__ import annotations

import torch

from ....kvstore.block_pool import NULL_PAGE, IntegrityError
from ....kvstore.tiers.device_kv import DeviceKV
from ..config.model_config import ModelConfig
from .kv_cache import PagedKVCache
from .kv_quant import KVScales


class DeviceKVCache(PagedKVCache):
    """K/V pages of every layer, held by the tiers' `DeviceKV`; the null page is never written."""

    def __init__(
        self, config: ModelConfig, device_kv: DeviceKV, scales: KVScales | None = None
    ) -> None:
        """`scales`: an fp8 device KV's (every tier's pages hold `x / scale`)."""
        layout = device_kv.layout
        if dict(config.groups) != dict(layout.layers):
            raise ValueError(
                f"model layer groups {dict(config.groups)} != KV layout {dict(layout.layers)}"
            )
        storage = {group: device_kv.storage(group) for group in config.groups}
        super().__init__(
            config,
            num_pages={group: int(pages.shape[2]) for group, pages in storage.items()},
            page_size=layout.page_size,
            device=device_kv.device,
            dtype=device_kv.dtype,
            null_page_id=NULL_PAGE,
            storage=storage,
            scales=scales,
        )
        self.device_kv = device_kv
        self._state_floats = {
            group: size // 4 for group, size in layout.state_bytes.items()
        }  # fp32 values per layer of a state page

    def states(self, layer: int) -> torch.Tensor:
        """`[num_pages, floats]` fp32 view of a recurrent layer's state pages (any KV dtype:
        a state page holds fp32 bytes)."""
        group, slot = self._slot[layer]
        floats = self._state_floats[group]
        return self._storage[group][slot, 0, :, 0, 0].view(torch.float32)[:, :floats]

    def check_integrity(self) -> None:
        """As `PagedKVCache`'s, reading state pages as the fp32 values they hold."""
        for group, floats in self._state_floats.items():
            states = self._storage[group][:, 0, :, 0, 0].view(torch.float32)[..., :floats]
            if bool(states[:, self.null_page_id].any()):
                raise IntegrityError(f"group {group!r}: null page {self.null_page_id} written")
            bad = int((~torch.isfinite(states)).sum())
            if bad:
                raise IntegrityError(f"group {group!r}: {bad} non-finite state values")
        self._check_groups(set(self._storage) - set(self._state_floats))
