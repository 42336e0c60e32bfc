"""Host and disk tiers under one manager's device pools: indexes, byte moves, events, metrics.

The manager owns a `KVTiers` and calls it from its owner thread only; so does everything here
that writes an index. The order of work for each kind of move:

| move              | index change (at once)                   | bytes (at `flush`)                |
|-------------------|------------------------------------------|-----------------------------------|
| device eviction   | host slot taken (oldest host block out)  | evicted host blocks -> disk, then |
|                   |                                          | device pages -> host slots        |
| ... no host pages | none until the write                     | device pages -> disk (rows)       |
| onboard (admit)   | host/disk blocks pinned, device pages    | disk files -> staging rows before |
|                   | taken and committed                      | any page is taken; rows -> device |
| prefetch landing  | host slot taken                          | file bytes (read by the worker)   |
|                   |                                          | -> host slot                      |

KV events describe the rank: a block is *stored* when it becomes findable on this rank's device
or host and *removed* when it leaves both. The shared disk is no rank's: every rank reaches it
alike, so it says nothing about where to route.

Block files are checked against the block's contents (parent id and tokens, disk_files.py), so a
disk tier with files keeps the contents of every block this rank may still write: given by the
manager as blocks are committed (`remember`), kept while the block is on device or host or on
its way to disk, forgotten after. A block whose contents are not known is not written.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..block_pool import IntegrityError
from ..deadlines import Deadlines
from ..events import KVEvent, KVEventKind, KVEventListener, ignore_event
from ..results import LOWER_TIERS, PrefixMatch
from .disk_files import DiskFiles, NoDiskFiles
from .disk_tier import DISK_READ_THREADS, DiskTier
from .metrics import DEVICE, DISK, HOST, TierMetrics, new_tier_metrics
from .page_bytes import NoBytes, TierBytes
from .prefetch import BlockKey, Prefetcher
from .tier_index import TierIndex

log = logging.getLogger(__name__)

# Staging rows a drain reuses per batch of device pages: bounds its host memory.
DRAIN_CHUNK_PAGES = 64
# How long a match that read a shared disk folder is handed out again (as NFS trusts cached
# attributes): a turn waiting for room is asked several times every step, and walking its
# whole prefix each time cost a 1b rank 4-8 ms before each 1 ms decode step at 116k tokens. A
# file that leaves meanwhile fails its read, as it may between any walk and its read; one
# that arrives is found by the next window's walk.
SHARED_FOLDER_TRUST_SECONDS = 0.05


@dataclass(frozen=True)
class StagedBlock:
    """A lower-tier block of a match whose bytes are ready in a host row."""

    position: int
    block_hash: int
    tier: str
    row: Any


class KVTiers:
    """Host and disk tiers of one rank, driven by the manager that owns the device pools."""

    def __init__(
        self,
        host_pages: Mapping[str, int],
        disk_pages: Mapping[str, int],
        page_bytes: Mapping[str, int],
        byte_store: TierBytes | None = None,
        disk_files: DiskFiles | NoDiskFiles | None = None,
        disk_prefetch_num_reqs: int = 0,
        prefetch_queue_blocks: int = 256,
        host_exclusive: bool = True,
        disk_read_threads: int = DISK_READ_THREADS,
    ) -> None:
        if disk_prefetch_num_reqs < 0:
            raise ValueError(f"disk_prefetch_num_reqs must be >= 0, got {disk_prefetch_num_reqs}")
        self.bytes = byte_store or NoBytes()
        self.page_bytes = dict(page_bytes)
        self.clock: Callable[[], float] = time.monotonic  # the manager's, once attached
        self._kept: Deadlines[int] = Deadlines()  # block id -> end of its cache TTL
        self.host = TierIndex(HOST, host_pages, self.kept)
        self.metrics: dict[str, TierMetrics] = new_tier_metrics()
        files = NoDiskFiles() if disk_files is None else disk_files
        self.disk = DiskTier(
            TierIndex(DISK, disk_pages, self.kept), files, self.metrics[DISK], disk_read_threads
        )
        self.disk_prefetch_num_reqs = disk_prefetch_num_reqs
        # Exclusive: a block onboarded from host leaves host (its next device eviction copies
        # it down again), so host and device never hold the same block twice and the two
        # tiers keep their sum of distinct blocks (docs/simulator.md, "An exclusive host tier").
        self.host_exclusive = host_exclusive
        self.device_kv = getattr(self.bytes, "kv", None)
        self._prefetcher = Prefetcher(self.disk.files, self.page_bytes, prefetch_queue_blocks)
        self._pending: list[tuple[str, int, int]] = []  # (life cycle, device page, host slot)
        self._pending_slots: set[tuple[str, int]] = set()
        self._to_disk: list[tuple[str, int, int]] = []  # (life cycle, hash, host slot)
        # (life cycle, device page, hash): evictions of a life cycle with no host pages, which
        # go straight to disk at `flush` (a rank given a disk tier and no host tier)
        self._device_to_disk: list[tuple[str, int, int]] = []
        self._listener: KVEventListener = ignore_event
        self._on_device: Callable[[str, int], bool] = lambda life_cycle, block_hash: False
        # Block id -> `hashing.block_contents`, only where files are checked against them.
        self.keeps_contents = isinstance(files, DiskFiles)
        self._contents: dict[int, bytes] = {}

    @classmethod
    def device_only(cls, life_cycles: Sequence[str]) -> KVTiers:
        """No host and no disk tier: the manager's default."""
        zero = dict.fromkeys(life_cycles, 0)
        return cls(zero, zero, zero)

    def attach(
        self,
        listener: KVEventListener,
        on_device: Callable[[str, int], bool],
        clock: Callable[[], float],
    ) -> KVEventListener:
        """Take the owning manager's event listener and clock (what cache TTLs are measured
        on); return the listener the device pools must call."""
        self._listener, self._on_device, self.clock = listener, on_device, clock
        return self._device_event

    # -- reads -----------------------------------------------------------------------------

    @property
    def has_lower_tiers(self) -> bool:
        """True if a host or disk tier can hold any block (else matching skips `locate`)."""
        return any(self.host.capacity.values()) or self.has_disk

    @property
    def has_disk(self) -> bool:
        """True if a disk tier can hold any block (else nothing is prefetched from it)."""
        return any(self.disk.index.capacity.values()) or isinstance(self.disk.files, DiskFiles)

    def index_version(self) -> tuple[int, int, int]:
        """Changes whenever `locate` may answer differently. A shared disk folder's files come
        and go with other ranks, which tell no one: there the last part is a time window
        (`SHARED_FOLDER_TRUST_SECONDS`), so what the folder said is trusted at most that long."""
        if isinstance(self.disk.files, DiskFiles):
            window = int(self.clock() / SHARED_FOLDER_TRUST_SECONDS)
            return self.host.version, self.disk.index.version, window
        # NOTE: the volume's own count too: a block another rank evicts from a shared volume
        # leaves this rank's index unchanged, and a match kept past it would stage that block
        # again after every miss, for ever.
        return self.host.version, self.disk.index.version, self.disk.files.version

    def locate(self, life_cycle: str, block_hash: int) -> str | None:
        """HOST or DISK for a block not on the device, else None (no mutation)."""
        if self.host.lookup(life_cycle, block_hash) is not None:
            return HOST
        return DISK if self.disk.has(life_cycle, block_hash) else None

    # -- cache TTLs ------------------------------------------------------------------------

    def keep_for(self, block_hashes: Sequence[int], seconds: float) -> None:
        """Evict these blocks from host and disk only after every block outside a TTL, for
        `seconds` (a conversation released inside its client's cache TTL)."""
        now = self.clock()
        self._kept.prune(now)
        self._kept.extend(block_hashes, now + seconds)

    def kept(self, block_hash: int) -> bool:
        """True while the block is inside a cache TTL (`keep_for`)."""
        return self._kept.until(block_hash, self.clock()) is not None

    # -- block contents (what a block file is checked against) -----------------------------

    def remember(self, block_hash: int, contents: Callable[[], bytes]) -> None:
        """Keep a committed block's contents for its disk file (built only when needed)."""
        if self.keeps_contents and block_hash not in self._contents:
            self._contents[block_hash] = contents()

    def forget(self, block_hashes: Sequence[int]) -> None:
        """Drop the contents of these blocks unless one of this rank's tiers still holds them
        (or writes them to disk at the next `flush`)."""
        if not self._contents:
            return
        pending = {block_hash for _, block_hash, _ in self._to_disk}
        pending.update(block_hash for _, _, block_hash in self._device_to_disk)
        for block_hash in block_hashes:
            if block_hash in pending or self._held(block_hash):
                continue
            self._contents.pop(block_hash, None)

    def num_contents(self) -> int:
        """Blocks whose contents are kept (bounded by the blocks on device and host)."""
        return len(self._contents)

    def _held(self, block_hash: int) -> bool:
        return any(
            self._on_device(name, block_hash) or self.host.lookup(name, block_hash) is not None
            for name in self.host.capacity
        )

    # -- device evictions (offload) --------------------------------------------------------

    def on_device_evict(self, life_cycle: str, page: int, block_hash: int) -> None:
        """A cached device page is being reused: keep its block on host (copied at `flush`), or
        on disk where the life cycle has no host pages."""
        if self.host.lookup(life_cycle, block_hash) is not None:
            self.host.touch(life_cycle, block_hash)
            return
        if not self.host.capacity.get(life_cycle) and self.disk.index.capacity.get(life_cycle):
            if not self.disk.has(life_cycle, block_hash):
                self._device_to_disk.append((life_cycle, page, block_hash))
            return
        slot = self._host_insert(life_cycle, block_hash)
        if slot is not None:
            self._pending.append((life_cycle, page, slot))
            self._pending_slots.add((life_cycle, slot))

    def flush(self) -> None:
        """Write evicted host blocks and host-less evicted device pages to disk, then copy
        evicted device pages to host."""
        self.disk.settle()
        straight, self._device_to_disk = self._device_to_disk, []
        for life_cycle in dict.fromkeys(name for name, _, _ in straight):
            moves = [(page, block) for name, page, block in straight if name == life_cycle]
            self._write_pages(life_cycle, moves)
        self.forget([block_hash for _, _, block_hash in straight])
        to_disk, self._to_disk = self._to_disk, []
        for life_cycle, block_hash, slot in to_disk:
            self._store_on_disk(life_cycle, block_hash, self.bytes.host_row(life_cycle, slot), HOST)
        self.forget([block_hash for _, block_hash, _ in to_disk])
        pending, self._pending = self._pending, []
        self._pending_slots.clear()
        by_life_cycle: dict[str, list[tuple[int, int]]] = {}
        for life_cycle, page, slot in pending:
            by_life_cycle.setdefault(life_cycle, []).append((page, slot))
        for life_cycle, moves in by_life_cycle.items():
            started = time.perf_counter()
            self.bytes.offload(life_cycle, [p for p, _ in moves], [s for _, s in moves])
            self._count_move(DEVICE, HOST, life_cycle, len(moves), started)

    # -- onboarding (admit) ----------------------------------------------------------------

    def stage(
        self,
        match: PrefixMatch,
        hashes: Sequence[int],
        contents: Callable[[int], bytes] = lambda index: b"",
    ) -> dict[str, list[StagedBlock]]:
        """Pin the match's host blocks and read its disk blocks into rows; `contents(i)` is
        what block i's file must hold (`SequenceHashes.contents`).

        Returns the staged blocks per life cycle in position order, or raises
        `StaleMatchError` after forgetting the disk blocks whose files were missing or failed
        their checks (the caller matches again; each retry has fewer disk blocks).
        """
        staged: dict[str, list[StagedBlock]] = {}
        bad = 0
        for name, locations in match.locations.items():
            # the lower blocks' positions in one C-level pass (most of a long match is on device)
            lower = itertools.compress(itertools.count(), map(LOWER_TIERS.__contains__, locations))
            blocks = [(i, hashes[i], locations[i]) for i in lower]
            disk_blocks = [(i, h) for i, h, t in blocks if t == DISK]
            disk_rows = dict(
                zip(disk_blocks, self.bytes.new_rows(name, len(disk_blocks)), strict=True)
            )
            started = time.perf_counter()
            expected = {key: contents(key[0]) if self.keeps_contents else b"" for key in disk_rows}
            # the files may be read several at once; the index changes follow in order
            reads = [
                (h, self.bytes.payload(row), expected[i, h]) for (i, h), row in disk_rows.items()
            ]
            read = dict(zip(disk_rows, self.disk.read_many(name, reads), strict=True))
            rows = []
            for index, block_hash, tier in blocks:
                if tier == HOST:
                    self.host.pin(name, block_hash)
                    self.host.touch(name, block_hash)
                    slot = cast(int, self.host.lookup(name, block_hash))  # pinned: held
                    row = self.bytes.host_row(name, slot)
                else:
                    key = (index, block_hash)
                    if not read[key]:
                        bad += 1
                        continue
                    row = disk_rows[key]
                    self.remember(block_hash, functools.partial(bytes, expected[key]))
                rows.append(StagedBlock(index, block_hash, tier, row))
            self.metrics[DEVICE].copy_seconds += time.perf_counter() - started
            staged[name] = rows
        if bad:
            self.release_pins()
            raise StaleMatchError(f"{bad} disk blocks of the match failed their checks")
        return staged

    def onboard(self, life_cycle: str, pages: Sequence[int], blocks: Sequence[StagedBlock]):
        """Copy staged blocks into the device pages taken for them (after `flush`)."""
        started = time.perf_counter()
        self.bytes.onboard(life_cycle, pages, [block.row for block in blocks])
        self.metrics[DEVICE].copy_seconds += time.perf_counter() - started
        found = Counter(block.tier for block in blocks)
        device = self.metrics[DEVICE]
        device.misses += len(blocks)
        device.pages_in += len(blocks)
        device.bytes_in += len(blocks) * self.page_bytes.get(life_cycle, 0)
        self.metrics[HOST].misses += found[DISK]
        if self.host_exclusive:  # the device holds them now (see _drop_host_copy)
            for block in blocks:
                if block.tier == HOST:
                    self.host.remove(life_cycle, block.block_hash)
        for tier, count in found.items():
            self.metrics[tier].hits += count
            self.metrics[tier].pages_out += count
            self.metrics[tier].bytes_out += count * self.page_bytes.get(life_cycle, 0)

    def count_device_hits(self, num_pages: int) -> None:
        """Pages of an admitted prefix that were already on the device."""
        self.metrics[DEVICE].hits += num_pages

    def release_pins(self) -> None:
        """End of an onboarding: staged blocks may be evicted again."""
        self.host.unpin_all()
        self.disk.index.unpin_all()

    # -- prefetch --------------------------------------------------------------------------

    def prefetch(
        self, keys: Sequence[BlockKey], contents: Mapping[int, bytes] | None = None
    ) -> int:
        """Read these disk blocks to host in the background, in order; cancel the others.
        `contents[block hash]` is what its file must hold (empty where files keep none).

        Returns how many new reads were queued (the queue is bounded; the rest wait for the
        next call).
        """
        wanted = dict.fromkeys(keys)
        in_flight = self._prefetcher.in_flight()
        self._prefetcher.cancel(in_flight - wanted.keys())
        queued = 0
        for key in wanted:
            if key in in_flight or self.host.lookup(*key) is not None:
                continue
            if not self._prefetcher.submit(key, (contents or {}).get(key[1], b"")):
                break
            queued += 1
        return queued

    def land_prefetched(self) -> int:
        """Put finished background reads on the host tier; returns how many landed."""
        landed = 0
        for (name, block_hash), (data, problem), contents in self._prefetcher.completed():
            if data is None:
                self.disk.missed(name, block_hash, problem or "unreadable")
                continue
            if self._on_device(name, block_hash) or self.host.lookup(name, block_hash) is not None:
                continue
            slot = self._host_insert(name, block_hash)
            if slot is None:
                continue
            self.flush()  # evicted host blocks reach disk before the slot is overwritten
            started = time.perf_counter()
            self.bytes.fill_row(self.bytes.host_row(name, slot), data)
            self.remember(block_hash, functools.partial(bytes, contents))
            self._count_move(DISK, HOST, name, 1, started)
            self.disk.keep(name, block_hash)
            self._listener(KVEvent(KVEventKind.STORED, name, block_hash))
            landed += 1
        return landed

    def wait_prefetch(self, timeout_s: float) -> bool:
        """Block until no background read is queued or running; False on timeout."""
        return self._prefetcher.wait_idle(timeout_s)

    # -- drain (scale-in: retained blocks to the shared disk) -------------------------------

    def num_off_disk(self, life_cycle: str, block_hashes: Sequence[int]) -> int:
        """How many of these blocks `write_device_blocks` would write now (no mutation)."""
        capacity = self.disk.index.capacity.get(life_cycle, 0)
        missing = sum(not self.disk.has(life_cycle, h) for h in block_hashes) if capacity else 0
        return min(missing, capacity)

    def write_device_blocks(self, life_cycle: str, blocks: Sequence[tuple[int, int]]) -> int:
        """Write committed device pages `(page, block hash)` to disk, skipping blocks the disk
        has (this rank's index or any rank's file); the pages stay on the device. Returns the
        blocks written: 0 without a disk tier.

        NOTE: at most the tier's capacity per call, the first blocks first, so that a call
        never evicts its own writes (callers put what a resume needs first).
        """
        capacity = self.disk.index.capacity.get(life_cycle, 0)
        todo = [(p, h) for p, h in blocks if not self.disk.has(life_cycle, h)] if capacity else []
        written = self._write_pages(life_cycle, todo[:capacity])
        self.disk.wait()  # a drain's blocks are on the volume before the rank may stop
        return written

    def _write_pages(self, life_cycle: str, todo: Sequence[tuple[int, int]]) -> int:
        """Device pages `(page, block hash)` to disk through rows, in chunks; blocks written."""
        if not todo:
            return 0
        rows = self.bytes.new_rows(life_cycle, min(len(todo), DRAIN_CHUNK_PAGES))
        written = 0
        for start in range(0, len(todo), DRAIN_CHUNK_PAGES):
            chunk = todo[start : start + DRAIN_CHUNK_PAGES]
            self.bytes.download(life_cycle, [page for page, _ in chunk], rows[: len(chunk)])
            for (_, block_hash), row in zip(chunk, rows, strict=False):
                written += self._store_on_disk(life_cycle, block_hash, row, DEVICE)
        return written

    # -- invariants and life ---------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise IntegrityError unless both indexes add up and no copy or pin is left over."""
        self.host.check_integrity()
        self.disk.index.check_integrity()
        if self._pending or self._to_disk or self._device_to_disk:
            raise IntegrityError(
                f"tiers: {len(self._pending)} offloads and {len(self._to_disk)} disk writes "
                "were never flushed"
            )
        if self.host.num_pinned() or self.disk.index.num_pinned():
            raise IntegrityError("tiers: blocks are still pinned after an onboarding")
        if self.host_exclusive:
            for name in self.host.capacity:
                both = [h for h in self.host.hashes(name) if self._on_device(name, h)]
                if both:
                    raise IntegrityError(
                        f"tiers: exclusive host holds {len(both)} {name!r} blocks that are "
                        "on the device too"
                    )

    def close(self) -> None:
        """Stop the prefetch worker, wait for copies in flight and land queued disk writes."""
        self._prefetcher.close()
        self.bytes.synchronize()
        self.disk.close()

    # -- internals -------------------------------------------------------------------------

    def _device_event(self, event: KVEvent) -> None:
        # NOTE: a block still (or already) on host stays findable on this rank either way.
        if self.host_exclusive and event.kind == KVEventKind.STORED:
            self._drop_host_copy(event.life_cycle, event.block_hash)
        if self.host.lookup(event.life_cycle, event.block_hash) is None:
            self._listener(event)
            if event.kind == KVEventKind.REMOVED:
                self.forget([event.block_hash])

    def _drop_host_copy(self, life_cycle: str, block_hash: int) -> None:
        """Exclusive host: a block now on the device leaves host (a pinned one when its
        onboarding ends, in `onboard`); a copy still on its way to its slot lands first."""
        slot = self.host.lookup(life_cycle, block_hash)
        if slot is None or self.host.pinned(life_cycle, block_hash):
            return
        if (life_cycle, slot) in self._pending_slots:
            self.flush()
        self.host.remove(life_cycle, block_hash)

    def _host_insert(self, life_cycle: str, block_hash: int) -> int | None:
        slot, evicted = self.host.insert(life_cycle, block_hash)
        for old_hash, old_slot in evicted:
            if (life_cycle, old_slot) in self._pending_slots:
                self.flush()  # the evicted block's bytes are still on their way to its slot
            self._to_disk.append((life_cycle, old_hash, old_slot))
            self.metrics[HOST].evictions += 1
            if not self._on_device(life_cycle, old_hash):
                self._listener(KVEvent(KVEventKind.REMOVED, life_cycle, old_hash))
        return slot

    def _store_on_disk(self, life_cycle: str, block_hash: int, row: Any, source: str) -> bool:
        """Write one row's block to disk (unless there); True if written. A refused write
        pauses disk writes for a while (`WriteBackoff`); the block is then not kept on disk."""
        if not self.disk.writes.ready():
            return False
        started = time.perf_counter()
        contents = self._contents.get(block_hash, b"")
        if self.keeps_contents and not contents:
            return False  # a file nobody could check: a recompute later is the safe loss
        try:
            written = self.disk.store(
                life_cycle, block_hash, lambda: self.bytes.payload(row), contents
            )
        except OSError as error:
            self.metrics[DISK].errors += 1
            pause = self.disk.writes.failed()
            log.warning("disk tier write refused (%s): no disk writes for %.0f s, then retrying",
                        error, pause)  # fmt: skip
            return False
        self.disk.writes.succeeded()
        if written:
            self._count_move(source, DISK, life_cycle, 1, started)
        return written

    def _count_move(self, source: str, target: str, life_cycle: str, pages: int, started: float):
        size = pages * self.page_bytes.get(life_cycle, 0)
        self.metrics[source].pages_out += pages
        self.metrics[source].bytes_out += size
        self.metrics[target].pages_in += pages
        self.metrics[target].bytes_in += size
        self.metrics[target].copy_seconds += time.perf_counter() - started


class StaleMatchError(RuntimeError):
    """Some disk blocks of a match turned out unreadable; match again."""
