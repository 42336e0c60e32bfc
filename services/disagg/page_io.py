"""Page bytes of a rank for a moved turn's prefix: real ones, or none on a `sim` rank.

A rank with tensors (`compute.cache`) reads and writes its KV pages (`blocks.py`); a rank of
the `sim` compute backend has no tensors, so its blocks travel as empty bytes: the same pulls,
block lists, page tables and commits, nothing copied (its step times come from the cost model).
Only the engine core thread calls these (it owns the page tables).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .blocks import KVBlock, install_blocks, read_pages


class TensorPages:
    """The pages of a rank's device KV cache."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def read(self, life_cycle: str, pages: Sequence[int]) -> list[bytes]:
        return read_pages(self.cache, life_cycle, pages)

    def install(self, page_tables: Mapping[str, Sequence[int]], blocks: Sequence[KVBlock]) -> int:
        """Write blocks into their pages; returns the bytes written."""
        return install_blocks(self.cache, page_tables, blocks)


class NoPages:
    """A rank without tensors: blocks carry no bytes and installing one writes nothing."""

    def read(self, life_cycle: str, pages: Sequence[int]) -> list[bytes]:
        return [b""] * len(pages)

    def install(self, page_tables: Mapping[str, Sequence[int]], blocks: Sequence[KVBlock]) -> int:
        return 0


def pages_of(core) -> TensorPages | NoPages:
    """The page access of a core's compute backend."""
    cache = getattr(core.compute, "cache", None)
    return NoPages() if cache is None else TensorPages(cache)
