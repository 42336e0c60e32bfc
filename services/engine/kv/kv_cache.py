"""Paged KV storage: per layer a K and a V tensor `[num_pages, page_size, kv_heads, head_dim]`.

Layers of one group (`full`, `window`) share page ids: a sequence has one page table per group,
and page `p` of that table holds the same token positions in every layer of the group. The
kvstore manager owns which page belongs to whom; this class owns only the bytes, and only the
model's forward writes them (through `write`).

An fp8 cache (`dtype=torch.float8_e4m3fn`) stores `x / scale` per KV head and layer
(kv_quant.py): `write` quantizes, and attention backends read through `kv_scales`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ....kvstore.block_pool import IntegrityError
from ..config.model_config import ModelConfig
from .kv_quant import KVScales, is_fp8, quantize
from .rope_store import rotate_and_write


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
        scales: KVScales | None = None,
    ) -> None:
        """`storage`, when given, holds each group's pages `[layers, 2, pages, page_size, kv_heads,
        head_dim]` (the tiers' device KV); else zero-filled tensors are allocated here.
        `scales`: an fp8 cache's per-head K/V scales (default: 1 everywhere); other dtypes
        take none."""
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
        if scales is not None and not is_fp8(dtype):
            raise ValueError(f"KV scales are for an fp8 cache, not {dtype}")
        if is_fp8(dtype):
            scales = scales or KVScales.ones(groups, config.num_kv_heads)
        self.scales = scales.to(self.device) if scales is not None else None

    def group_of(self, layer: int) -> str:
        """Layer group that holds `layer`'s pages."""
        return self._slot[layer][0]

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V page tensors of `layer`, each `[num_pages, page_size, kv_heads, head_dim]`."""
        group, i = self._slot[layer]
        pages = self._storage[group][i]
        return pages[0], pages[1]

    def kv_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`layer`'s K and V scales `[kv_heads]` (fp32) of an fp8 cache; None otherwise."""
        if self.scales is None:
            return None
        group, i = self._slot[layer]
        per_layer = self.scales.group(group)[i]
        return per_layer[0], per_layer[1]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store `k`, `v` `[tokens, kv_heads, head_dim]` at slots `page * page_size + offset`
        (quantized through the layer's scales in an fp8 cache)."""
        k_pages, v_pages = self.kv(layer)
        flat_shape = (-1, *k_pages.shape[2:])
        scales = self.kv_scales(layer)
        if scales is None:
            k_pages.view(flat_shape).index_copy_(0, slots, k.to(self.dtype))
            v_pages.view(flat_shape).index_copy_(0, slots, v.to(self.dtype))
            return
        # NOTE: through byte views: index_copy_ has no fp8 kernel on CPU.
        for pages, x, scale in ((k_pages, k, scales[0]), (v_pages, v, scales[1])):
            stored = quantize(x, scale).view(torch.uint8)
            pages.view(torch.uint8).view(flat_shape).index_copy_(0, slots, stored)

    def write_stacked(self, layer: int, kv: torch.Tensor, slots: torch.Tensor) -> None:
        """`write` of K and V stacked `[2, tokens, kv_heads, head_dim]`: one copy for both
        (a layer's K and V pages are one tensor)."""
        if self.scales is not None:
            self.write(layer, kv[0], kv[1], slots)
            return
        group, i = self._slot[layer]
        pages = self._storage[group][i]
        pages.view(2, -1, *pages.shape[3:]).index_copy_(1, slots, kv.to(self.dtype))

    def write_rotating(
        self,
        layer: int,
        qkv: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        heads: int,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Rotate the packed `qkv`'s q and k heads, store k and v at `slots` (rows where `valid`
        is set) and return q, in one kernel (rope_store.py); None where it does not take the
        call, and nothing is written."""
        if self.scales is not None:
            return None
        group, i = self._slot[layer]
        pages = self._storage[group][i]
        flat = pages.view(2, -1, *pages.shape[3:])
        return rotate_and_write(flat, qkv, rope, slots, valid, heads)

    def check_integrity(self) -> None:
        """Raise if the null page was ever written or any page holds a non-finite value.

        Reads every page: for tests and idle-time checks, not for the serving hot path.
        """
        self._check_groups(set(self._storage))

    def _check_groups(self, groups: set[str]) -> None:
        for group in sorted(groups):
            storage = self._storage[group]
            null = storage[:, :, self.null_page_id]
            if is_fp8(storage.dtype):
                null = null.view(torch.uint8)
            if bool(null.any()):
                raise IntegrityError(
                    f"group {group!r}: null page {self.null_page_id} holds "
                    f"{int(null.count_nonzero())} non-zero values"
                )
            bad = _non_finite(storage)
            if bad:
                raise IntegrityError(f"group {group!r}: {bad} non-finite K/V values")

    def bytes_per_token(self) -> int:
        """KV bytes one token takes over all layers."""
        per_layer = 2 * self.config.num_kv_heads * self.config.head_dim * self.dtype.itemsize
        return per_layer * self.config.num_layers


def _non_finite(storage: torch.Tensor) -> int:
    """NaN/inf values in `storage` (e4m3 has no inf: its NaN is every exponent and mantissa
    bit set, and isfinite has no fp8 kernel)."""
    if is_fp8(storage.dtype):
        return int(((storage.view(torch.uint8) & 0x7F) == 0x7F).sum())
    return int((~torch.isfinite(storage)).sum())
