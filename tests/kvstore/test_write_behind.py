"""Block files written behind the core thread (kvstore/tiers/write_behind.py): a queued block is
on the tier at once, removes keep their order, refused writes are counted, drains wait."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.kvstore.tiers import disk_tier
from kvfleet.kvstore.tiers.disk_files import DiskFiles
from kvfleet.kvstore.tiers.write_behind import WriteBehindFiles
from tier_factories import BLOCK, make_tiered, prompt_of, serve

FINGERPRINT = {"full": b"full/1x2x4x2x8/float32"}
CONTENTS = b"parent and tokens"


def payload(seed: int) -> bytes:
    return bytes((seed * 7 + i) % 256 for i in range(4096))


def read_back(files: DiskFiles, block_hash: int, contents: bytes = CONTENTS) -> bytes | None:
    out = bytearray(4096)
    problem = files.check_into("full", block_hash, memoryview(out), contents)
    return None if problem else bytes(out)


def test_a_queued_block_is_read_from_its_copy_until_its_file_lands(tmp_path):
    """If this fails, a block evicted to disk is a miss while its file is still being written:
    the tier must serve it from the queued copy, checked like a file, and the copy must give
    way to the very same bytes on disk."""
    files = WriteBehindFiles(tmp_path, FINGERPRINT, start=False)
    source = bytearray(payload(1))
    files.write("full", 0xA1, memoryview(source), CONTENTS)
    source[:] = payload(9)  # the caller's row is reused at once: the copy must not change
    assert files.contains("full", 0xA1)
    assert not files.path("full", 0xA1).exists()
    assert read_back(files, 0xA1) == payload(1)
    assert read_back(files, 0xA1, b"another block") is None  # an id collision is a miss
    files.start()
    files.wait()
    assert files.settle() == []
    assert read_back(DiskFiles(tmp_path, FINGERPRINT), 0xA1) == payload(1)
    files.close()


def test_a_remove_queued_after_a_write_leaves_no_file(tmp_path):
    """If this fails, a block evicted from the index right after its write comes back on disk
    (the remove ran before the write): removes must keep the queue's order."""
    files = WriteBehindFiles(tmp_path, FINGERPRINT, start=False)
    files.write("full", 0xB2, payload(2), CONTENTS)
    files.remove("full", 0xB2)
    assert not files.contains("full", 0xB2)
    files.start()
    files.wait()
    assert not files.path("full", 0xB2).exists()
    files.close()


def test_a_rewrite_keeps_its_copy_until_its_own_write_lands(tmp_path):
    """If this fails, the report of an older write of a block drops the copy of a newer one,
    and the block is read from the older file (or missed) until the newer one lands."""
    files = WriteBehindFiles(tmp_path, FINGERPRINT, start=False)
    files.write("full", 0xC3, payload(3), CONTENTS)
    files.remove("full", 0xC3)
    files.write("full", 0xC3, payload(4), CONTENTS)
    files.run_one()  # the first write lands; the remove and the second write wait
    assert files.settle() == []
    assert read_back(files, 0xC3) == payload(4)
    files.start()
    files.wait()
    assert files.settle() == []
    assert read_back(DiskFiles(tmp_path, FINGERPRINT), 0xC3) == payload(4)
    files.close()


def test_a_refused_write_is_counted_and_pauses_disk_writes():
    """If this fails, a write the volume refused on the writer thread goes unseen: the tier
    must count it, drop the block from its index and pause writes, as for a refused write in
    place."""
    manager = make_tiered(write_behind=True)
    try:
        disk = manager.tiers.disk
        block_hash = 0xD4
        folder = disk.files.path("full", block_hash).parent
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.write_bytes(b"a file where the block's folder goes")
        assert disk.store("full", block_hash, lambda: memoryview(payload(5)), CONTENTS)
        disk.wait()
        assert manager.tiers.metrics["disk"].errors == 1
        assert disk.index.lookup("full", block_hash) is None
        assert not disk.writes.ready()
    finally:
        manager.tiers.close()


def test_a_writer_behind_holds_back_the_caller_not_more_copies(monkeypatch):
    """If this fails, a volume slower than the evictions makes the queued copies grow without
    bound: past the bound the tier must wait for the writer before it queues another block."""
    block_bytes = len(payload(0))
    monkeypatch.setattr(disk_tier, "MAX_PENDING_BYTES", 2 * block_bytes)
    manager = make_tiered(write_behind=True)
    try:
        disk = manager.tiers.disk
        for block_hash in range(1, 11):
            assert disk.store("full", block_hash, lambda: memoryview(payload(6)), CONTENTS)
            assert disk.files.pending_bytes <= 3 * block_bytes
        disk.wait()
        assert disk.files.pending_bytes == 0
    finally:
        manager.tiers.close()


def test_blocks_written_behind_come_back_bit_identical():
    """If this fails, a turn reusing blocks that went GPU -> host -> disk through the writer
    thread gets other bytes than it computed (serve checks every reused page's bits)."""
    manager = make_tiered(device_pages=6, host_pages=2, write_behind=True)
    try:
        serve(manager, "a", prompt_of(1))
        for seed in range(2, 5):
            serve(manager, f"push{seed}", prompt_of(seed))
        assert manager.tiers.metrics["disk"].pages_in > 0
        # all but the last block (a turn computes at least its last token), read from disk
        assert serve(manager, "a again", prompt_of(1)) == len(prompt_of(1)) - BLOCK
        assert manager.tiers.metrics["disk"].hits == 3
        manager.check_integrity()
        files = manager.tiers.disk.files
        files.wait()
        manager.tiers.flush()  # each step's flush lets the copies of landed writes go
        assert not files._pending
    finally:
        manager.tiers.close()
    assert not [name for _, _, names in os.walk(manager.tiers.disk.files.root) for name in names
                if name.endswith(".tmp")]  # fmt: skip


def test_a_drains_blocks_are_on_the_volume_when_its_write_returns():
    """If this fails, a draining rank may stop (SIGTERM's path) while its blocks are still
    queued: the drain's write must return only once every file has landed."""
    manager = make_tiered(device_pages=12, host_pages=2, write_behind=True)
    try:
        manager.add_request("turn", prompt_of(6))
        manager.admit("turn", len(prompt_of(6)))
        manager.allocate("turn", len(prompt_of(6)))
        manager.commit("turn", len(prompt_of(6)))
        block_ids = manager.computed_block_ids("turn")
        assert manager.flush_resume_point_to_disk(block_ids) == len(block_ids)
        files = manager.tiers.disk.files
        assert not files._pending  # every copy gave way to its landed file
        assert all(files.path("full", block_id).is_file() for block_id in block_ids)
        manager.finish_request("turn")
    finally:
        manager.tiers.close()


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["write", "remove", "step", "settle"]), st.integers(0, 3)),
        max_size=30,
    )
)
def test_any_order_of_writes_removes_and_landings_keeps_written_blocks_readable(ops):
    """If this fails, some interleaving of writes, removes, the writer's progress and settles
    loses a block whose last call was a write (a miss before or after its file lands), serves
    other bytes than the block's, or leaves the folder other than the last calls say.

    Blocks are content-addressed, so a block's bytes never change; a removed block may still
    be read until its queued remove runs (its own bytes: what another rank's file would give)."""
    with tempfile.TemporaryDirectory() as folder:
        files = WriteBehindFiles(folder, FINGERPRINT, start=False)
        written: set[int] = set()
        for op, block in ops:
            if op == "write":
                files.write("full", block, payload(block), CONTENTS)
                written.add(block)
            elif op == "remove":
                files.remove("full", block)
                written.discard(block)
            elif op == "step" and not files._jobs.empty():
                files.run_one()
            else:
                files.settle()
            assert files.pending_bytes == sum(len(entry[1]) for entry in files._pending.values())
            for each in range(4):
                got = read_back(files, each)
                assert got in (payload(each), None)
                assert got is not None or each not in written
        files.start()
        files.wait()
        files.settle()
        assert not files._pending
        landed = DiskFiles(folder, FINGERPRINT)
        for each in range(4):
            assert read_back(landed, each) == (payload(each) if each in written else None)
        files.close()
