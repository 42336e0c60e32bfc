"""The shared disk tier: bad files are misses, capacity evicts files, shared files are found."""

import logging
import os

import pytest
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.tiers.disk_files import HEADER, DiskFiles
from tier_factories import BLOCK, make_tiered, prompt_of, serve


def _a_on_disk(**kwargs):
    """A manager whose turn "a" (4 blocks) lives only on disk."""
    manager = make_tiered(device_pages=6, host_pages=2, **kwargs)
    serve(manager, "a", prompt_of(1))
    for seed in range(2, 5):
        serve(manager, f"push{seed}", prompt_of(seed))
    return manager


def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


BAD_FILES = {
    "flipped payload byte": lambda path: _flip_byte(path, -3),
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: HEADER.size + 20]),
    "foreign format": lambda path: path.write_bytes(b"not a kv block at all" * 40),
    "foreign layout": lambda path: _flip_byte(path, HEADER.size + 2),
}


@pytest.mark.parametrize("damage", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_block_file_is_a_miss_and_is_removed(damage, caplog):
    """A damaged third block must cut reuse to two blocks, with correct recomputed KV."""
    manager = _a_on_disk()
    hashes = block_hashes(prompt_of(1), BLOCK)
    path = manager.tiers.disk.files.path("full", hashes[2])
    damage(path)
    prompt = [*prompt_of(1), 5]
    with caplog.at_level(logging.WARNING):
        assert serve(manager, "a2", prompt) == 2 * BLOCK  # serve() checks the reused bytes
    assert "is a miss and is removed" in caplog.text
    assert not path.exists() or manager.tiers.disk.files.read_into("full", hashes[2], None)
    assert serve(manager, "a3", prompt) == 4 * BLOCK  # the recomputed block is right too
    manager.check_integrity()
    manager.tiers.close()


def test_disk_capacity_evicts_the_oldest_files():
    """Past its capacity the disk tier must delete its least recently used block files."""
    manager = make_tiered(device_pages=5, host_pages=2, disk_pages=4)
    for seed in range(1, 6):
        serve(manager, f"t{seed}", prompt_of(seed))
    disk = manager.tiers.disk
    kept = disk.index.hashes("full")
    files = sorted(p for p in disk.files.root.rglob("*.kvb"))
    assert len(kept) == 4
    assert sorted(disk.files.path("full", h) for h in kept) == files
    evicted = 5 * 4 - 4 - 2 - 4  # blocks served - device pages - host slots - disk capacity
    assert manager.tiers.metrics["disk"].evictions == evicted
    manager.check_integrity()
    manager.tiers.close()


def test_a_block_written_by_another_pod_is_found_and_onboarded():
    """Two ranks on one volume: a prefix one of them spilled must be reused by the other."""
    writer = _a_on_disk()
    folder = str(writer.tiers.disk.files.root)
    reader = make_tiered(device_pages=6, host_pages=2, disk_dir=folder)
    assert serve(reader, "a2", [*prompt_of(1), 5]) == 4 * BLOCK
    assert reader.tiers.metrics["disk"].hits == 4
    for manager in (writer, reader):
        manager.check_integrity()
        manager.tiers.close()


def test_writes_leave_no_temp_files():
    """Atomic writes rename their temp files; none may be left behind."""
    manager = _a_on_disk()
    root = manager.tiers.disk.files.root
    assert [p for p in root.rglob("*") if p.is_file() and p.suffix != ".kvb"] == []
    manager.tiers.close()


def test_a_file_for_another_block_hash_is_not_returned(tmp_path):
    """A file renamed to another block's name must fail its check, not serve wrong KV."""
    files = DiskFiles(tmp_path, {"full": b"full/1x2x4x2x8/float32"})
    files.write("full", 1, b"\x01" * 64)
    os.makedirs(files.path("full", 2).parent, exist_ok=True)
    os.replace(files.path("full", 1), files.path("full", 2))
    assert files.read_into("full", 2, memoryview(bytearray(64))) is False
    assert not files.path("full", 2).exists()
