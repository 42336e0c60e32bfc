"""KV blocks as bytes: what a hand-off moves, read from and written into paged KV storage.

A block of life cycle `lc` at prompt position `index` is one page of every layer of that
life cycle's layer group, laid out `[layers, 2 (K, V), page_size, kv_heads, head_dim]` like the
kvstore tiers' `KVLayout`, so a block file on the shared disk tier and a hand-off block hold the
same bytes. Only the core thread reads or writes pages (it owns the page tables).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ...kvstore.tiers.layout import KVLayout

# The block hash of the partial last block of a prompt: it has no hash, only a position.
NO_HASH = 0


class CorruptBlockError(ValueError):
    """A received block's bytes fail their checksum or have the wrong size."""


@dataclass(frozen=True)
class KVBlock:
    """One block's bytes for one life cycle."""

    life_cycle: str
    index: int
    block_hash: int
    data: bytes
    # What its shared disk file is checked against (`SequenceHashes.contents`); empty for the
    # partial last block, whose file is the request's own.
    contents: bytes = b""

    @property
    def crc32(self) -> int:
        return zlib.crc32(self.data)


def kv_layout(cache) -> KVLayout:
    """The page layout of a `PagedKVCache` (life cycle = layer group), as the tiers describe it."""
    config = cache.config
    return KVLayout(
        page_size=cache.page_size,
        kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        layers=dict(config.groups),
        dtype=str(cache.dtype).removeprefix("torch."),
    )


def read_pages(cache, life_cycle: str, pages: Sequence[int]) -> list[bytes]:
    """The bytes of `pages` of one layer group, one `bytes` per page (a copy)."""
    if not pages:
        return []
    index = torch.tensor(list(pages), dtype=torch.long, device=cache.device)
    per_layer = []
    for layer in cache.config.groups[life_cycle]:
        k_pages, v_pages = cache.kv(layer)
        per_layer.append(torch.stack((k_pages[index], v_pages[index]), dim=1))
    # [pages, layers, 2, page_size, kv_heads, head_dim], contiguous per page
    stacked = torch.stack(per_layer, dim=1).contiguous().cpu()
    raw = stacked.view(torch.uint8).reshape(len(pages), -1).numpy()
    return [row.tobytes() for row in raw]


def write_pages(cache, life_cycle: str, pages: Sequence[int], data: Sequence[bytes]) -> None:
    """Overwrite `pages` of one layer group with block bytes as `read_pages` returns them."""
    if not pages:
        return
    layers = cache.config.groups[life_cycle]
    shape = (len(layers), 2, cache.page_size, cache.config.num_kv_heads, cache.config.head_dim)
    expected = _page_bytes(cache, life_cycle)
    for block in data:
        if len(block) != expected:
            raise CorruptBlockError(f"{life_cycle!r} block of {len(block)} bytes != {expected}")
    buffer = torch.frombuffer(bytearray(b"".join(data)), dtype=cache.dtype)
    blocks = buffer.view(len(pages), *shape).to(cache.device)
    index = torch.tensor(list(pages), dtype=torch.long, device=cache.device)
    if cache.dtype.itemsize == 1:  # NOTE: index_copy_ has no fp8 kernel on CPU
        blocks = blocks.view(torch.uint8)
    for slot, layer in enumerate(layers):
        k_pages, v_pages = cache.kv(layer)
        if cache.dtype.itemsize == 1:
            k_pages, v_pages = k_pages.view(torch.uint8), v_pages.view(torch.uint8)
        k_pages.index_copy_(0, index, blocks[:, slot, 0])
        v_pages.index_copy_(0, index, blocks[:, slot, 1])


def install_blocks(
    cache, page_tables: Mapping[str, Sequence[int]], blocks: Iterable[KVBlock]
) -> int:
    """Write received blocks into the receiver's pages (by life cycle and position); bytes."""
    by_group: dict[str, tuple[list[int], list[bytes]]] = {}
    total = 0
    for block in blocks:
        table = page_tables[block.life_cycle]
        if not 0 <= block.index < len(table) or table[block.index] == 0:
            raise CorruptBlockError(
                f"{block.life_cycle!r} block {block.index} has no page among {len(table)}"
            )
        pages, data = by_group.setdefault(block.life_cycle, ([], []))
        pages.append(table[block.index])
        data.append(block.data)
        total += len(block.data)
    for life_cycle, (pages, data) in by_group.items():
        write_pages(cache, life_cycle, pages, data)
    return total


def _page_bytes(cache, life_cycle: str) -> int:
    layers = len(cache.config.groups[life_cycle])
    per_token = 2 * cache.config.num_kv_heads * cache.config.head_dim * cache.dtype.itemsize
    return layers * cache.page_size * per_token
