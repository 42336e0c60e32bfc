"""Chained block hashes: equal ids mean equal prefixes, in every process.

A block's id is `xxh3_64(tokens of the block, seed=parent id)`; the first block's parent is the
root id of the request's extra key (model, adapter, tenant salt). xxh3 is stable across processes
and platforms, so the disk tier and KV events from other ranks can compare ids directly.

Ids are 64 bits (the proto's uint64) and are not checked against tokens on a rank's own device
and host. The shared disk tier, reached by every pod, does check: a block file stores
`block_contents` (parent id and tokens) and a read compares them, so an id collision anywhere
in the fleet is a miss there, never another prompt's KV.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import xxhash

TOKEN_DTYPE = np.dtype("<u4")
TOKEN_BYTES = TOKEN_DTYPE.itemsize
MAX_TOKEN_ID = 2**32 - 1
SMALL_PACK = 16  # up to this many ids, pack without numpy
ONE_TOKEN = struct.Struct("<I")


def salt_extra_key(cache_salt: str) -> bytes:
    """The extra key of a tenant's cache salt, so salted prefixes never match unsalted ones
    (the engine hashes blocks with it; the router keys its prefix index with it)."""
    return b"salt:" + cache_salt.encode() if cache_salt else b""


def root_hash(extra_key: bytes = b"") -> int:
    """The parent id of a sequence's first block, salted by the extra key."""
    return xxhash.xxh3_64_intdigest(b"kvfleet/block-root/" + extra_key)


def block_contents(parent: int, block: bytes | bytearray | memoryview) -> bytes:
    """What a block id stands for: its parent id (8 bytes, little-endian) and its packed tokens."""
    return parent.to_bytes(8, "little") + bytes(block)


def pack_tokens(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids as little-endian uint32 bytes; raises ValueError for ids out of range."""
    if isinstance(token_ids, (list, tuple)) and len(token_ids) <= SMALL_PACK:
        # A decode step appends one token per sequence: struct skips numpy's per-call cost.
        try:
            if len(token_ids) == 1:
                return ONE_TOKEN.pack(token_ids[0])
            return struct.pack(f"<{len(token_ids)}I", *token_ids)
        except struct.error:
            pass  # out of range or not integers: numpy below says which
    array = np.asarray(token_ids, dtype=np.int64)
    if array.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {array.shape}")
    if array.size and (array.min() < 0 or array.max() > MAX_TOKEN_ID):
        raise ValueError(
            f"token ids must lie in [0, {MAX_TOKEN_ID}], got min {array.min()} max {array.max()}"
        )
    return array.astype(TOKEN_DTYPE).tobytes()


class SequenceHashes:
    """The growing token buffer of one sequence and the ids of its full blocks.

    Hashing is incremental: appending tokens hashes only the blocks they complete, so a match of
    an already-hashed prompt is a dict walk. One C call per block (seeded xxh3 over a memoryview
    slice) keeps 2k blocks near a millisecond.
    """

    def __init__(self, block_size: int, extra_key: bytes = b"") -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.root = root_hash(extra_key)
        self._buffer = bytearray()
        self._hashes: list[int] = []

    @property
    def num_tokens(self) -> int:
        """Tokens appended so far."""
        return len(self._buffer) // TOKEN_BYTES

    @property
    def hashes(self) -> list[int]:
        """Ids of the full blocks, in token order (read-only by convention)."""
        return self._hashes

    def prefix(self, num_tokens: int) -> SequenceHashes:
        """A new sequence of this one's first `num_tokens` tokens, its block ids copied (what
        `extend` of those tokens would make, without hashing them again)."""
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"a prefix of 0..{self.num_tokens} tokens, got {num_tokens}")
        copy = SequenceHashes.__new__(SequenceHashes)
        copy.block_size, copy.root = self.block_size, self.root
        copy._buffer = self._buffer[: num_tokens * TOKEN_BYTES]
        copy._hashes = self._hashes[: num_tokens // self.block_size]
        return copy

    def block_tokens(self, index: int) -> tuple[int, ...]:
        """The token ids of full block `index`."""
        block_bytes = self.block_size * TOKEN_BYTES
        return struct.unpack_from(f"<{self.block_size}I", self._buffer, index * block_bytes)

    def contents(self, index: int) -> bytes:
        """`block_contents` of full block `index` (what its disk file is checked against)."""
        block_bytes = self.block_size * TOKEN_BYTES
        parent = self._hashes[index - 1] if index else self.root
        return block_contents(parent, self._buffer[index * block_bytes : (index + 1) * block_bytes])

    def extend(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Append tokens and hash every block they complete."""
        self.extend_packed(pack_tokens(token_ids))

    @staticmethod
    def extend_each(sequences: Sequence[SequenceHashes], packed: bytes) -> None:
        """`sequences[i].extend_packed(token i of packed)`: one packed token each (a decode
        step's), hashing only where a token completes a block."""
        view = memoryview(packed)
        for index, sequence in enumerate(sequences):
            buffer = sequence._buffer
            buffer += view[index * TOKEN_BYTES : (index + 1) * TOKEN_BYTES]
            if len(buffer) % (sequence.block_size * TOKEN_BYTES) == 0:
                sequence.extend_packed(b"")  # hashes the block just completed

    def extend_packed(self, packed: bytes | memoryview) -> None:
        """`extend` with tokens packed already (`pack_tokens`: a batch packs once for all)."""
        self._buffer += packed
        block_bytes = self.block_size * TOKEN_BYTES
        num_full = len(self._buffer) // block_bytes
        if num_full == len(self._hashes):
            return
        view = memoryview(self._buffer)
        parent = self._hashes[-1] if self._hashes else self.root
        hashes = self._hashes
        digest = xxhash.xxh3_64_intdigest
        try:
            for start in range(len(hashes) * block_bytes, num_full * block_bytes, block_bytes):
                parent = digest(view[start : start + block_bytes], seed=parent)
                hashes.append(parent)
        finally:
            view.release()


def block_hashes(
    token_ids: Sequence[int] | np.ndarray, block_size: int, extra_key: bytes = b""
) -> list[int]:
    """Ids of every full block of `token_ids` (a convenience over SequenceHashes)."""
    sequence = SequenceHashes(block_size, extra_key)
    sequence.extend(token_ids)
    return sequence.hashes
