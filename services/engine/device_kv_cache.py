"""The model's view of the tiers' device KV: a `PagedKVCache` over `DeviceKV`'s tensors.

The kvstore tiers own the device tensors (so that offload and onboarding copy the very pages
the model reads); the forward, the batch builder and the hand-off code read and write them
through the same calls as any `PagedKVCache`. Layer groups are kvstore life cycles of the same
names.
"""

from __future__ import annotations

from ...kvstore.block_pool import NULL_PAGE
from ...kvstore.tiers.device_kv import DeviceKV
from .config import ModelConfig
from .kv_cache import PagedKVCache


class DeviceKVCache(PagedKVCache):
    """K/V pages of every layer, held by the tiers' `DeviceKV`; the null page is never written."""

    def __init__(self, config: ModelConfig, device_kv: DeviceKV) -> None:
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
        )
        self.device_kv = device_kv
