"""An admission's disk blocks are read several at once (`DiskTier.read_many`), with the same
outcome as reading them one by one: the rows' bytes, the pins, the misses and the bad files."""

from __future__ import annotations

import threading

import pytest
from kvfleet.kvstore.tiers.disk_files import DiskFiles
from kvfleet.kvstore.tiers.disk_tier import DiskTier
from kvfleet.kvstore.tiers.metrics import TierMetrics
from kvfleet.kvstore.tiers.tier_index import TierIndex

FINGERPRINT = {"full": b"full/test"}
KEY = b"k" * 32
BLOCK_BYTES = 4096


def payload(seed: int) -> bytes:
    return bytes((seed * 7 + i) % 251 for i in range(BLOCK_BYTES))


def tier(folder, pages: int = 8, threads: int = 4) -> DiskTier:
    files = DiskFiles(folder, FINGERPRINT, key=KEY)
    return DiskTier(TierIndex("disk", {"full": pages}), files, TierMetrics(), threads)


def contents(block_hash: int) -> bytes:
    return b"contents-%d" % block_hash


def reads(hashes) -> list[tuple[int, memoryview, bytes]]:
    return [(h, memoryview(bytearray(BLOCK_BYTES)), contents(h)) for h in hashes]


@pytest.mark.parametrize("threads", [1, 4])
def test_many_reads_fill_rows_pin_blocks_and_drop_bad_files_as_single_reads_do(
    tmp_path, threads
) -> None:
    """If this fails, reading an admission's blocks together loses what a read one at a time
    gives: each good block's bytes in its row and its pin, and for a missing or damaged file a
    miss, the block out of the index and the bad file removed."""
    disk = tier(tmp_path, threads=threads)
    for h in (1, 2, 3, 4):
        assert disk.store("full", h, lambda h=h: memoryview(payload(h)), contents(h))
    damaged = disk.files.path("full", 3)
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    disk.files.path("full", 4).unlink()
    wanted = reads((1, 2, 3, 4))
    assert disk.read_many("full", wanted) == [True, True, False, False]
    assert bytes(wanted[0][1]) == payload(1) and bytes(wanted[1][1]) == payload(2)
    assert disk.index.pinned("full", 1) and disk.index.pinned("full", 2)
    assert disk.index.lookup("full", 3) is None and disk.index.lookup("full", 4) is None
    assert not damaged.exists()
    assert disk.metrics.misses == 2
    disk.close()


def test_the_files_are_read_at_once_on_threads_of_their_own(tmp_path) -> None:
    """If this fails, `read_many` reads one file after another on the caller's thread, and a
    long disk prefix holds the engine's core thread for the sum of the reads: four reads must
    all be under way together (each waits for the other three)."""
    disk = tier(tmp_path, threads=4)
    for h in (1, 2, 3, 4):
        disk.store("full", h, lambda h=h: memoryview(payload(h)), contents(h))
    together = threading.Barrier(4, timeout=10)
    read = disk.files.check_into
    callers = set()

    def check_into(*args):
        callers.add(threading.get_ident())
        together.wait()
        return read(*args)

    disk.files.check_into = check_into
    assert disk.read_many("full", reads((1, 2, 3, 4))) == [True] * 4
    assert threading.get_ident() not in callers
    disk.close()
    assert disk._readers is None


def test_reading_another_ranks_block_never_evicts_a_block_of_the_same_read(tmp_path) -> None:
    """If this fails, a block another rank wrote, adopted into a full index while an
    admission's blocks are read, evicts one of those very blocks and deletes its file after its
    bytes were read: the blocks this rank indexed are pinned before any file is read."""
    other = tier(tmp_path, pages=8)
    other.store("full", 9, lambda: memoryview(payload(9)), contents(9))
    disk = tier(tmp_path, pages=2)
    for h in (1, 2):
        disk.store("full", h, lambda h=h: memoryview(payload(h)), contents(h))
    # block 9 (only the other rank's index has it) is read first: its adoption wants a slot
    assert disk.read_many("full", reads((9, 1, 2))) == [True, True, True]
    assert disk.files.path("full", 1).exists() and disk.files.path("full", 2).exists()
    assert disk.index.pinned("full", 1) and disk.index.pinned("full", 2)
    disk.close()


def test_threads_must_be_at_least_one(tmp_path) -> None:
    with pytest.raises(ValueError, match="read_threads"):
        tier(tmp_path, threads=0)


def test_a_byteless_tier_reads_on_the_callers_thread(tmp_path) -> None:
    """If this fails, the simulator's tiers (no payload to read) hand every block check to a
    thread pool, which costs far more than the check: a replay of hours ran for minutes."""
    disk = tier(tmp_path, threads=4)
    for h in (1, 2):
        disk.store("full", h, lambda h=h: memoryview(payload(h)), contents(h))
    assert disk.read_many("full", [(h, None, contents(h)) for h in (1, 2)]) == [True, True]
    assert disk._readers is None
