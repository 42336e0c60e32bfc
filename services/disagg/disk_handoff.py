"""The `disk` transport: a parked request's blocks go through the shared disk tier's files.

Full blocks are content-addressed files of the disk tier (`DiskFiles`, same layout fingerprint),
so a block some rank already wrote is not written again and later turns can find it there too.
The partial last block has no hash: it is filed under a per-request key and removed once read.
"""

from __future__ import annotations

import logging

import xxhash

from ...kvstore.tiers.disk_files import DiskFiles
from ...kvstore.tiers.layout import KVLayout
from .blocks import NO_HASH, KVBlock
from .transport_types import FetchRequest, TransportError

log = logging.getLogger(__name__)


def tail_key(request_id: str, index: int) -> int:
    """The file key of a request's partial last block (never 0)."""
    return xxhash.xxh3_64_intdigest(f"kvfleet-handoff/{request_id}".encode(), seed=index) or 1


class DiskHandoff:
    """Writes parked requests' blocks (context side) and reads them back (generation side)."""

    name = "disk"

    def __init__(self, root: str, layout: KVLayout) -> None:
        names = list(layout.layers)
        self.files = DiskFiles(root, {name: layout.fingerprint(name) for name in names})
        self.page_bytes = {name: layout.page_bytes(name) for name in names}
        self.files.probe()

    def has(self, life_cycle: str, block_hash: int) -> bool:
        """True if a full block's file is there already (nothing to write)."""
        return block_hash != NO_HASH and self.files.contains(life_cycle, block_hash)

    def write(self, request_id: str, blocks: list[KVBlock]) -> int:
        """Store blocks (the partial one under the request's key); returns bytes written."""
        written = 0
        for block in blocks:
            key = block.block_hash or tail_key(request_id, block.index)
            self.files.write(block.life_cycle, key, block.data, block.contents)
            written += len(block.data)
        return written

    def fetch(self, request: FetchRequest) -> list[KVBlock]:
        """Read every wanted block that is on disk; the partial block's file is then removed."""
        blocks: list[KVBlock] = []
        for life_cycle, wanted in request.wanted.items():
            for index, block_hash in wanted:
                key = block_hash or tail_key(request.request_id, index)
                out = bytearray(self.page_bytes[life_cycle])
                contents = request.contents.get(index, b"") if block_hash else b""
                if not self.files.read_into(life_cycle, key, memoryview(out), contents):
                    continue
                if block_hash == NO_HASH:
                    self.files.remove(life_cycle, key)
                blocks.append(KVBlock(life_cycle, index, block_hash, bytes(out)))
        if not blocks:
            raise TransportError(f"no block of request {request.request_id!r} on the disk tier")
        return blocks

    def done(self, request: FetchRequest) -> None:
        """Remove the request's partial-block files (full blocks stay: the tier's to keep)."""
        for life_cycle, wanted in request.wanted.items():
            for index, block_hash in wanted:
                if block_hash == NO_HASH:
                    self.forget(request.request_id, life_cycle, index)

    def forget(self, request_id: str, life_cycle: str, index: int) -> None:
        """Remove a partial block's file nobody read (its hold expired)."""
        self.files.remove(life_cycle, tail_key(request_id, index))

    def close(self) -> None:
        """Nothing to release."""
