"""Block files in a directory that many engine processes share (no torch, no index).

One file per block, content-addressed: `<root>/<life cycle>/<hh>/<hash:016x>.kvb`. A file is a
header, the life cycle's layout fingerprint, the block's contents and the payload:

| bytes | field                                                                  |
|-------|------------------------------------------------------------------------|
| 4     | magic `KVFB`                                                           |
| 2     | format version                                                         |
| 2     | fingerprint length F                                                   |
| 8     | block hash                                                             |
| 8     | payload length N                                                       |
| 4     | contents length C                                                      |
| 16    | tag: keyed BLAKE3 of the fields above, the fingerprint, the contents, the payload |
| F     | layout fingerprint (life cycle, page shape, dtype)                     |
| C     | contents: what the block id stands for (`hashing.block_contents`: parent id, tokens) |
| N     | payload                                                                |

The 64-bit block id names the file, and every pod of the fleet writes and reads these files: a
read passes the contents it expects and a file with other contents (an id collision) is a miss,
so a collision costs a recompute, never another prompt's KV served fleet-wide.

The tag's key is the fleet's (`disk_key.py`), so a file written by anyone without it (forged,
or another fleet's) fails its check like a damaged one. Writes go to a unique temp file in the
same folder, then `os.replace`: a reader sees the old file or the new one, never a torn one,
and two writers of one block both succeed (equal content by construction). A file that fails
any check is a miss: logged, removed, never returned.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

import blake3

from .disk_key import disk_key

log = logging.getLogger(__name__)

MAGIC = b"KVFB"
FORMAT_VERSION = 3  # 3: the block's contents, checked on read
FIELDS = struct.Struct("<4sHHQQI")  # what the tag covers, with fingerprint, contents, payload
TAG_BYTES = 16
HEADER = struct.Struct(f"<{FIELDS.size}s{TAG_BYTES}s")
MISSING = "no file"  # `check_into`'s reason when there is nothing to read
# `check_into`'s reason for a FIFO, device, socket, folder or symlink where a block file should
# be: a miss, left in place (never removed by a reader), counted by the tier.
NOT_REGULAR = "not a regular file"
# Never blocks on open (a FIFO without a writer would block forever), never follows a link.
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class InPlaceWrites:
    """The write queue's hooks where every write lands where it is made: nothing is pending,
    refused later or left to land (write_behind.py's `WriteBehindFiles` has a queue)."""

    pending_bytes = 0  # block copies queued for writing

    def settle(self) -> list[tuple[str, int, OSError]]:
        """Writes refused since the last call: none, as every write was done in place."""
        return []

    def wait(self) -> None:
        """Every write has landed when it returns."""

    def close(self) -> None:
        """Nothing is left to land."""


class DiskFiles(InPlaceWrites):
    """Reads and writes block files under `root`; safe to use from several processes at once."""

    def __init__(
        self, root: str | os.PathLike, fingerprints: Mapping[str, bytes], key: bytes | None = None
    ) -> None:
        self.root = Path(root)
        self.fingerprints = dict(fingerprints)
        self._key = key  # None: the fleet's (`disk_key`), looked up on first use
        self._told_not_regular = False  # such files are logged once per process, then counted

    @property
    def key(self) -> bytes:
        """The tag key: given, else the fleet secret's, else this process's own."""
        if self._key is None:
            self._key = disk_key()
        return self._key

    def tag(self, fields: bytes, fingerprint: bytes, contents: bytes, payload: memoryview) -> bytes:
        """The keyed BLAKE3 of one file's authenticated parts."""
        hasher = blake3.blake3(key=self.key, max_threads=blake3.blake3.AUTO)
        for part in (fields, fingerprint, contents, payload):
            hasher.update(part)
        return hasher.digest(TAG_BYTES)

    def path(self, life_cycle: str, block_hash: int) -> Path:
        """Where the block's file lives."""
        name = f"{block_hash:016x}"
        return self.root / life_cycle / name[:2] / f"{name}.kvb"

    def probe(self) -> None:
        """Create the folders, find the key, write and remove one file; raises OSError if that
        fails."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.key:  # found now: a missing one fails here, not in a write
            raise OSError(f"{self.root}: empty disk tier key")
        with tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe.", delete=True) as probe:
            probe.write(b"kvfleet")
            probe.flush()

    def contains(self, life_cycle: str, block_hash: int) -> bool:
        """True if a file for the block exists now (it may still fail its checks on read)."""
        return self.path(life_cycle, block_hash).is_file()

    def write(
        self,
        life_cycle: str,
        block_hash: int,
        payload: memoryview | bytes | None,
        contents: bytes = b"",
    ) -> None:
        """Store the block and its `contents` atomically; raises OSError (full disk...)."""
        if payload is None:
            raise ValueError("a block file needs the block's bytes (byte-less tiers keep none)")
        path = self.path(life_cycle, block_hash)
        fingerprint = self.fingerprints[life_cycle]
        data = memoryview(payload).cast("B")
        fields = FIELDS.pack(
            MAGIC, FORMAT_VERSION, len(fingerprint), block_hash, len(data), len(contents)
        )
        header = HEADER.pack(fields, self.tag(fields, fingerprint, contents, data))
        try:
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        except FileNotFoundError:  # first block in this folder (or the volume was wiped)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(header)
                out.write(fingerprint)
                out.write(contents)
                out.write(data)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def read_into(
        self, life_cycle: str, block_hash: int, out: memoryview | None, contents: bytes = b""
    ) -> bool:
        """Fill `out` with the payload of the block with these `contents`; False on a miss (a
        bad file, or another block's under a colliding id, is logged and removed)."""
        problem = self.check_into(life_cycle, block_hash, out, contents)
        if problem is None:
            return True
        if problem not in (MISSING, NOT_REGULAR):
            self.discard(life_cycle, block_hash, problem)
        return False

    def check_into(
        self, life_cycle: str, block_hash: int, out: memoryview | None, contents: bytes = b""
    ) -> str | None:
        """Fill `out` with the payload of the block with these `contents`; why it could not
        (`MISSING`: no file), or None. Leaves a bad file where it is (the caller decides, on
        its own thread)."""
        path = self.path(life_cycle, block_hash)
        try:
            fd = os.open(path, OPEN_FLAGS)
        except FileNotFoundError:
            return MISSING
        except OSError as error:
            if error.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                return self._not_regular(path, "a symlink")
            return f"unreadable: {error}"
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                return self._not_regular(path, stat.filemode(mode))
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb") as source:
                fd = -1  # the file object closes it now
                return self._read_checked(source, life_cycle, block_hash, out, contents)
        except OSError as error:
            return f"unreadable: {error}"
        finally:
            if fd >= 0:
                os.close(fd)

    def _not_regular(self, path: Path, what: str) -> str:
        if not self._told_not_regular:
            self._told_not_regular = True
            log.warning(
                "disk tier: %s is %s, not a block file: a miss (logged once; counted in "
                "kvfleet_engine_kv_tier_refused_files_total)",
                path,
                what,
            )
        return NOT_REGULAR

    def discard(self, life_cycle: str, block_hash: int, problem: str) -> None:
        """Log why a block's file is a miss and remove it."""
        log.warning(
            "disk tier: %s is a miss and is removed: %s", self.path(life_cycle, block_hash), problem
        )
        self.remove(life_cycle, block_hash)

    def remove(self, life_cycle: str, block_hash: int) -> None:
        """Delete the block's file if present (another process may have removed it already)."""
        try:
            self.path(life_cycle, block_hash).unlink(missing_ok=True)
        except OSError as error:
            log.warning("disk tier: cannot remove block %016x: %s", block_hash, error)

    def _read_checked(
        self, source, life_cycle: str, block_hash: int, out: memoryview | None, contents: bytes
    ) -> str | None:
        """Read and check one open file into `out`; the reason it is bad, or None."""
        raw = source.read(HEADER.size)
        if len(raw) != HEADER.size:
            return f"truncated header ({len(raw)} of {HEADER.size} bytes)"
        fields, tag = HEADER.unpack(raw)
        magic, version, fp_len, stored_hash, length, contents_len = FIELDS.unpack(fields)
        if magic != MAGIC or version != FORMAT_VERSION:
            return f"foreign format (magic {magic!r}, version {version})"
        expected_fp = self.fingerprints[life_cycle]
        fingerprint = source.read(fp_len)
        if fingerprint != expected_fp or stored_hash != block_hash:
            return f"foreign block ({fingerprint!r}, {stored_hash:#x}) != ({expected_fp!r})"
        stored_contents = source.read(contents_len)
        if stored_contents != contents:
            return "another block's contents under this id (an id collision, or a foreign file)"
        target = memoryview(bytearray(length)) if out is None else memoryview(out).cast("B")
        if length != len(target):
            return f"payload of {length} bytes, the layout needs {len(target)}"
        size = os.fstat(source.fileno()).st_size
        expected_size = HEADER.size + fp_len + contents_len + length
        if size != expected_size:
            return f"file of {size} bytes, header says {expected_size}"
        got = source.readinto(target)
        if got != length:
            return f"payload of {got} bytes, header says {length}"
        if not hmac.compare_digest(self.tag(fields, fingerprint, contents, target), tag):
            return "tag mismatch (damaged, or not written with this fleet's key)"
        return None


class MarkerFiles(DiskFiles):
    """Block files without a payload, for byte-less ranks (the engine's `sim` compute backend):
    the header, fingerprint and contents alone, so ranks sharing the folder find each other's
    blocks (a drained rank's flush, host evictions) with the same checks, and no bytes move.

    NOTE: kept in a folder of their own (`build_tiers`): a rank with real pages would take a
    marker file for a foreign block and remove it, and the other way round.
    """

    def write(
        self,
        life_cycle: str,
        block_hash: int,
        payload: memoryview | bytes | None,
        contents: bytes = b"",
    ) -> None:
        """Store the block's marker (its `contents`, no payload) atomically."""
        super().write(life_cycle, block_hash, b"", contents)

    def check_into(
        self, life_cycle: str, block_hash: int, out: memoryview | None, contents: bytes = b""
    ) -> str | None:
        """Check the block's marker file; there is no payload to fill `out` with."""
        return super().check_into(life_cycle, block_hash, None, contents)


class NoDiskFiles(InPlaceWrites):
    """The byte-less stand-in: the simulator's disk tier is an index and nothing else."""

    # What another rank may change here: nothing (`SharedBlockSet` counts its changes).
    version = 0

    def check_into(self, life_cycle: str, block_hash: int, out, contents: bytes = b""):
        """The index said the block is there; with no bytes that is all there is."""
        return None

    def contains(self, life_cycle: str, block_hash: int) -> bool:
        """Nothing is found beyond the index."""
        return False

    def write(self, life_cycle: str, block_hash: int, payload, contents: bytes = b"") -> None:
        """Nothing to store."""

    def read_into(self, life_cycle: str, block_hash: int, out, contents: bytes = b"") -> bool:
        """The index said the block is there; with no bytes that is all there is."""
        return True

    def remove(self, life_cycle: str, block_hash: int) -> None:
        """Nothing to delete."""


class SharedBlockSet(NoDiskFiles):
    """The simulator's shared disk: which blocks are on it, in memory, one set for a fleet.

    Every rank's disk tier writes into and reads from the same set, as engine ranks do
    through one folder: a rank finds a block another rank wrote, and a block one rank's index
    evicts is gone for all (its file deleted), so another rank's read of it misses.
    """

    def __init__(self) -> None:
        self._blocks: set[tuple[str, int]] = set()
        # Bumped by every block that comes or goes: another rank's write or eviction changes
        # what this rank's matches find (KVTiers.index_version).
        self.version = 0

    @property
    def blocks(self) -> int:
        """How many blocks are on the volume."""
        return len(self._blocks)

    def contains(self, life_cycle: str, block_hash: int) -> bool:
        return (life_cycle, block_hash) in self._blocks

    def write(self, life_cycle: str, block_hash: int, payload, contents: bytes = b"") -> None:
        if (life_cycle, block_hash) not in self._blocks:
            self._blocks.add((life_cycle, block_hash))
            self.version += 1

    def check_into(self, life_cycle: str, block_hash: int, out, contents: bytes = b""):
        return None if (life_cycle, block_hash) in self._blocks else MISSING

    def read_into(self, life_cycle: str, block_hash: int, out, contents: bytes = b"") -> bool:
        return (life_cycle, block_hash) in self._blocks

    def remove(self, life_cycle: str, block_hash: int) -> None:
        if (life_cycle, block_hash) in self._blocks:
            self._blocks.discard((life_cycle, block_hash))
            self.version += 1
