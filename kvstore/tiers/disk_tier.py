"""The disk tier of one rank: its LRU index over the shared folder, and the folder's files.

The index is this rank's view (capacity, recency); the files are shared with other ranks, so a
block another rank wrote is found through the files and adopted into the index when read.

A refused write (ENOSPC, EIO, EFBIG...) pauses this rank's disk writes (`WriteBackoff`): 1 s,
doubling per failure up to a minute, reset by a write that succeeds. Reads go on meanwhile,
and the tier comes back by itself once the volume takes writes again.

An admission's blocks may be read `read_threads` at a time (`read_many`; 1 by default): a
file's read and its keyed hash release the GIL, so on a host with cores to spare the core
thread's wait for a long disk prefix can shrink with the threads. The threads only fill the
caller's rows and say what was wrong; the index changes, and the removal of bad files, stay
with the caller's thread, in the blocks' order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .disk_files import MISSING, NOT_REGULAR, DiskFiles, NoDiskFiles
from .metrics import TierMetrics
from .tier_index import TierIndex
from .write_behind import MAX_PENDING_BYTES

log = logging.getLogger(__name__)

# Block files an admission reads at once (`DiskTier.read_many`). 1 (one after another, on the
# caller's thread) until more is measured faster on a GPU host: on the 2-core CI machine 4 gave
# no gain (bench/admit_stall_bench.py --disk-read-threads, docs/tiers.md "Reads").
DISK_READ_THREADS = 1
# One block file to read: (block hash, the row its payload goes to, the contents it must hold).
BlockRead = tuple[int, "memoryview | None", bytes]


class WriteBackoff:
    """When disk writes may be tried again after failures: exponential, capped, resettable."""

    def __init__(
        self,
        first_seconds: float = 1.0,
        max_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first_seconds = first_seconds
        self.max_seconds = max_seconds
        self.clock = clock
        self._wait = first_seconds
        self._until = float("-inf")

    def ready(self) -> bool:
        """True unless the last failure's pause is still running."""
        return self.clock() >= self._until

    def failed(self) -> float:
        """Start a pause after a refused write; returns its length in seconds."""
        wait = self._wait
        self._until = self.clock() + wait
        self._wait = min(2 * wait, self.max_seconds)
        return wait

    def succeeded(self) -> None:
        """A write went through: the next failure pauses for the first length again."""
        self._wait = self.first_seconds


class DiskTier:
    """Index + files; evicting a block from the index deletes its file."""

    def __init__(
        self,
        index: TierIndex,
        files: DiskFiles | NoDiskFiles,
        metrics: TierMetrics,
        read_threads: int = DISK_READ_THREADS,
    ):
        if read_threads < 1:
            raise ValueError(f"read_threads must be >= 1, got {read_threads}")
        self.index = index
        self.files = files
        self.metrics = metrics
        self.writes = WriteBackoff()
        self.read_threads = read_threads
        self._readers: ThreadPoolExecutor | None = None  # made at the first read of many
        # Blocks whose file failed its checks and could not be removed (a read-only volume):
        # found again, they would be staged and missed again by every retry of an admission.
        self._unreadable: set[tuple[str, int]] = set()

    def has(self, life_cycle: str, block_hash: int) -> bool:
        """True if this rank indexed the block or any rank's file for it exists (no mutation)."""
        if self.index.lookup(life_cycle, block_hash) is not None:
            return True
        if (life_cycle, block_hash) in self._unreadable:
            return False
        return self.files.contains(life_cycle, block_hash)

    def keep(self, life_cycle: str, block_hash: int) -> bool:
        """Index a block that is (or is about to be) on disk; False if the tier has no room."""
        if self.index.lookup(life_cycle, block_hash) is not None:
            self.index.touch(life_cycle, block_hash)
            return True
        slot, evicted = self.index.insert(life_cycle, block_hash)
        for old_hash, _ in evicted:
            self.files.remove(life_cycle, old_hash)
            self.metrics.evictions += 1
        return slot is not None

    def store(
        self,
        life_cycle: str,
        block_hash: int,
        payload: Callable[[], memoryview | None],
        contents: bytes = b"",
    ) -> bool:
        """Write the block (with its `contents`) unless it is there already; True if bytes were
        written.

        Raises OSError when the volume refuses the write (full, read-only).
        """
        known = self.index.lookup(life_cycle, block_hash) is not None
        if not self.keep(life_cycle, block_hash) or known:
            return False
        unreadable = (life_cycle, block_hash) in self._unreadable
        if self.files.contains(life_cycle, block_hash) and not unreadable:
            return False  # another rank wrote it: content-addressed, so these very bytes
        if self.files.pending_bytes >= MAX_PENDING_BYTES:
            self.wait()  # the writer is behind: its copies may not grow without bound
        try:
            self.files.write(life_cycle, block_hash, payload(), contents)
        except OSError:
            self.index.remove(life_cycle, block_hash)
            raise
        self._unreadable.discard((life_cycle, block_hash))  # good bytes replaced the bad file
        return True

    def settle(self) -> None:
        """Account for write-behind writes that ended (`WriteBehindFiles`): a refused one
        leaves the index (unless a read holds it: then its next read misses) and pauses disk
        writes as a refused write does."""
        for life_cycle, block_hash, error in self.files.settle():
            if not self.index.pinned(life_cycle, block_hash):
                self.index.remove(life_cycle, block_hash)
            self.metrics.errors += 1
            pause = self.writes.failed()
            log.warning("disk tier write refused (%s): no disk writes for %.0f s, then retrying",
                        error, pause)  # fmt: skip

    def wait(self) -> None:
        """Return once this rank's queued disk writes have landed (a drain's)."""
        self.files.wait()
        self.settle()

    def close(self) -> None:
        """Finish queued disk writes and stop their thread and the readers."""
        self.files.close()
        self.settle()
        if self._readers is not None:
            self._readers.shutdown(wait=True)
            self._readers = None

    def read_many(self, life_cycle: str, reads: Sequence[BlockRead]) -> list[bool]:
        """`read` of each block, the files read `read_threads` at a time: True for each block
        now in its row (pinned until the onboarding ends), False for a miss."""
        # byte-less tiers (the simulator's, the `sim` backend's markers) check in microseconds
        if len(reads) < 2 or self.read_threads == 1 or reads[0][1] is None:
            return [self.read(life_cycle, *one) for one in reads]
        if self._readers is None:
            self._readers = ThreadPoolExecutor(self.read_threads, thread_name_prefix="kv-disk-read")
        # NOTE: pinned before any is read: adopting another rank's block below may evict from
        # the index, and must not take (and delete the file of) a block already in a row.
        for block_hash, _, _ in reads:
            if self.index.lookup(life_cycle, block_hash) is not None:
                self.index.pin(life_cycle, block_hash)
        check = self.files.check_into
        problems = list(self._readers.map(lambda one: check(life_cycle, *one), reads))
        return [
            self._found(life_cycle, block_hash, problem)
            for (block_hash, _, _), problem in zip(reads, problems, strict=True)
        ]

    def read(
        self, life_cycle: str, block_hash: int, out: memoryview | None, contents: bytes = b""
    ) -> bool:
        """Read the block with these `contents` into `out` and pin it until the onboarding
        ends; False on a miss."""
        return self._found(
            life_cycle, block_hash, self.files.check_into(life_cycle, block_hash, out, contents)
        )

    def _found(self, life_cycle: str, block_hash: int, problem: str | None) -> bool:
        """Index and pin a block read whole (`problem` None), else count the miss."""
        if problem is None:
            if self.keep(life_cycle, block_hash):
                self.index.pin(life_cycle, block_hash)
            return True
        self.missed(life_cycle, block_hash, problem)
        return False

    def missed(self, life_cycle: str, block_hash: int, problem: str) -> None:
        """A read found no usable file: forget the block; a bad file is removed, a non-regular
        one (FIFO, device, link: never ours) left alone and counted."""
        if problem == NOT_REGULAR:
            self.metrics.refused_files += 1
        elif problem != MISSING and isinstance(self.files, DiskFiles):
            self.files.discard(life_cycle, block_hash, problem)
            if self.files.contains(life_cycle, block_hash):  # its removal failed
                self._unreadable.add((life_cycle, block_hash))
        self.index.remove(life_cycle, block_hash)
        self.metrics.misses += 1
