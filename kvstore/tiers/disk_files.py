"""Block files in a directory that many engine processes share (no torch, no index).

One file per block, content-addressed: `<root>/<life cycle>/<hh>/<hash:016x>.kvb`. A file is a
header, the life cycle's layout fingerprint and the payload:

| bytes | field                                              |
|-------|----------------------------------------------------|
| 4     | magic `KVFB`                                       |
| 2     | format version                                     |
| 2     | fingerprint length F                               |
| 8     | block hash                                         |
| 8     | payload length N                                   |
| 8     | xxh3_64 of the payload, seeded with the block hash |
| F     | layout fingerprint (life cycle, page shape, dtype) |
| N     | payload                                            |

Writes go to a unique temp file in the same folder, then `os.replace`: a reader sees the old
file or the new one, never a torn one, and two writers of one block both succeed (equal content
by construction). A file that fails any check is a miss: logged, removed, never returned.
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

import xxhash

log = logging.getLogger(__name__)

MAGIC = b"KVFB"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sHHQQQ")


class DiskFiles:
    """Reads and writes block files under `root`; safe to use from several processes at once."""

    def __init__(self, root: str | os.PathLike, fingerprints: Mapping[str, bytes]) -> None:
        self.root = Path(root)
        self.fingerprints = dict(fingerprints)

    def path(self, life_cycle: str, block_hash: int) -> Path:
        """Where the block's file lives."""
        name = f"{block_hash:016x}"
        return self.root / life_cycle / name[:2] / f"{name}.kvb"

    def probe(self) -> None:
        """Create the folders and write and remove one file; raises OSError if that fails."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe.", delete=True) as probe:
            probe.write(b"kvfleet")
            probe.flush()

    def contains(self, life_cycle: str, block_hash: int) -> bool:
        """True if a file for the block exists now (it may still fail its checks on read)."""
        return self.path(life_cycle, block_hash).is_file()

    def write(self, life_cycle: str, block_hash: int, payload: memoryview | bytes) -> None:
        """Store the block atomically; raises OSError (full disk, read-only volume...)."""
        path = self.path(life_cycle, block_hash)
        fingerprint = self.fingerprints[life_cycle]
        data = memoryview(payload).cast("B")
        checksum = xxhash.xxh3_64_intdigest(data, seed=block_hash)
        header = HEADER.pack(
            MAGIC, FORMAT_VERSION, len(fingerprint), block_hash, len(data), checksum
        )
        try:
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        except FileNotFoundError:  # first block in this folder (or the volume was wiped)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(header)
                out.write(fingerprint)
                out.write(data)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def read_into(self, life_cycle: str, block_hash: int, out: memoryview | None) -> bool:
        """Fill `out` with the block's payload; False on a miss (a bad file is logged, removed)."""
        path = self.path(life_cycle, block_hash)
        try:
            with open(path, "rb") as source:
                problem = self._read_checked(source, life_cycle, block_hash, out)
        except FileNotFoundError:
            return False
        except OSError as error:
            problem = f"unreadable: {error}"
        if problem is None:
            return True
        log.warning("disk tier: %s is a miss and is removed: %s", path, problem)
        self.remove(life_cycle, block_hash)
        return False

    def remove(self, life_cycle: str, block_hash: int) -> None:
        """Delete the block's file if present (another process may have removed it already)."""
        try:
            self.path(life_cycle, block_hash).unlink(missing_ok=True)
        except OSError as error:
            log.warning("disk tier: cannot remove block %016x: %s", block_hash, error)

    def _read_checked(
        self, source, life_cycle: str, block_hash: int, out: memoryview | None
    ) -> str | None:
        """Read and check one open file into `out`; the reason it is bad, or None."""
        raw = source.read(HEADER.size)
        if len(raw) != HEADER.size:
            return f"truncated header ({len(raw)} of {HEADER.size} bytes)"
        magic, version, fp_len, stored_hash, length, checksum = HEADER.unpack(raw)
        if magic != MAGIC or version != FORMAT_VERSION:
            return f"foreign format (magic {magic!r}, version {version})"
        expected_fp = self.fingerprints[life_cycle]
        fingerprint = source.read(fp_len)
        if fingerprint != expected_fp or stored_hash != block_hash:
            return f"foreign block ({fingerprint!r}, {stored_hash:#x}) != ({expected_fp!r})"
        target = memoryview(bytearray(length)) if out is None else memoryview(out).cast("B")
        if length != len(target):
            return f"payload of {length} bytes, the layout needs {len(target)}"
        size = os.fstat(source.fileno()).st_size
        if size != HEADER.size + fp_len + length:
            return f"file of {size} bytes, header says {HEADER.size + fp_len + length}"
        got = source.readinto(target)
        if got != length:
            return f"payload of {got} bytes, header says {length}"
        if xxhash.xxh3_64_intdigest(target, seed=block_hash) != checksum:
            return "checksum mismatch"
        return None


class NoDiskFiles:
    """The byte-less stand-in: the simulator's disk tier is an index and nothing else."""

    def contains(self, life_cycle: str, block_hash: int) -> bool:
        """Nothing is found beyond the index."""
        return False

    def write(self, life_cycle: str, block_hash: int, payload) -> None:
        """Nothing to store."""

    def read_into(self, life_cycle: str, block_hash: int, out) -> bool:
        """The index said the block is there; with no bytes that is all there is."""
        return True

    def remove(self, life_cycle: str, block_hash: int) -> None:
        """Nothing to delete."""
