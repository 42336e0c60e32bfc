"""Paged KV storage: per layer a K and a V tensor `[num_pages, page_size, kv_heads, head_dim]`.

Layers of one group (`full`, `window`) share page ids: a sequence has one page table per group,
and page `p` of that table holds the same token positions in every layer of the group. The
kvstore manager owns which page belongs to whom; this class owns only the bytes, and only the
model's forward writes them (through `write`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...kvstore.block_pool import IntegrityError
from .config import ModelConfig


class PagedKVCache:
    """K/V pages of every layer, grouped by layer group; page `null_page_id` is never written."""

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int | Mapping[str, int],
        page_size: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        null_page_id: int = 0,
        storage: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """`storage`, when given, holds each group's pages `[layers, 2, pages, page_size, kv_heads,
        head_dim]` (the tiers' device KV); else zero-filled tensors are allocated here."""
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        groups = config.groups
        if isinstance(num_pages, int):
            num_pages = dict.fromkeys(groups, num_pages)
        missing = sorted(set(groups) - set(num_pages))
        if missing:
            raise ValueError(f"num_pages has no entry for layer groups {missing}")
        for group in groups:
            if not 0 <= null_page_id < num_pages[group]:
                raise ValueError(
                    f"null_page_id={null_page_id} outside group {group!r} of "
                    f"{num_pages[group]} pages"
                )
        self.config = config
        self.page_size = page_size
        self.null_page_id = null_page_id
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_pages = {group: int(num_pages[group]) for group in groups}
        # NOTE: zero-filled, not empty: a kernel that loads whole pages reads rows past a
        # sequence's length and masks their scores, but 0 * NaN would still poison the output.
        self._storage = (
            dict(storage)
            if storage is not None
            else {
                group: torch.zeros(
                    len(layers),
                    2,
                    self.num_pages[group],
                    page_size,
                    config.num_kv_heads,
                    config.head_dim,
                    device=self.device,
                    dtype=dtype,
                )
                for group, layers in groups.items()
            }
        )
        self._slot = {
            layer: (group, i) for group, layers in groups.items() for i, layer in enumerate(layers)
        }

    def group_of(self, layer: int) -> str:
        """Layer group that holds `layer`'s pages."""
        return self._slot[layer][0]

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V page tensors of `layer`, each `[num_pages, page_size, kv_heads, head_dim]`."""
        group, i = self._slot[layer]
        pages = self._storage[group][i]
        return pages[0], pages[1]

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
        self._check_groups(set(self._storage))

    def _check_groups(self, groups: set[str]) -> None:
        for group in sorted(groups):
            storage = self._storage[group]
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
