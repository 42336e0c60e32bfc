"""The shared disk tier: bad files are misses, capacity evicts files, shared files are found."""

import logging
import os
import shutil
import subprocess
import sys

import pytest
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.tiers.disk_files import HEADER, DiskFiles
from kvfleet.kvstore.tiers.disk_key import SECRET_ENV
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


@pytest.mark.timeout(60)  # the rule broken, the admission below never returns
def test_a_bad_block_file_that_cannot_be_removed_is_not_matched_again(monkeypatch, caplog):
    """If this fails, a damaged file on a volume that refuses its removal (read-only, another
    owner's) is found by every retry of the admission, missed, and found again: the rank's
    core thread spins on one request for ever."""
    manager = _a_on_disk()
    hashes = block_hashes(prompt_of(1), BLOCK)
    path = manager.tiers.disk.files.path("full", hashes[2])
    _flip_byte(path, -3)
    real_unlink = type(path).unlink

    def refused(self, missing_ok=False):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(type(path), "unlink", refused)
    prompt = [*prompt_of(1), 5]
    with caplog.at_level(logging.WARNING):
        assert serve(manager, "a2", prompt) == 2 * BLOCK  # serve() checks the reused bytes
    assert "cannot remove block" in caplog.text and path.exists()
    assert not manager.tiers.disk.has("full", hashes[2])
    for seed in range(2, 5):  # a2's blocks leave the device: the good block 2 replaces the bad
        serve(manager, f"again{seed}", prompt_of(seed))
    assert manager.tiers.disk.has("full", hashes[2])
    assert serve(manager, "a3", prompt) == 4 * BLOCK  # block 2 read whole from its new file
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


KV_LAYOUT_CHANGES = {
    "bf16 blocks read by an fp8 fleet": ({"dtype": "bfloat16"}, {"dtype": "float8_e4m3fn"}),
    "fp8 blocks read by a bf16 fleet": ({"dtype": "float8_e4m3fn"}, {"dtype": "bfloat16"}),
    "e5m2 blocks read as e4m3 (same bytes)": (
        {"dtype": "float8_e5m2"},
        {"dtype": "float8_e4m3fn"},
    ),
    "fp8 blocks of other scales": (
        {"dtype": "float8_e4m3fn", "scales_tag": "aa"},
        {"dtype": "float8_e4m3fn", "scales_tag": "bb"},
    ),
}


@pytest.mark.parametrize(("written", "read"), KV_LAYOUT_CHANGES.values(), ids=KV_LAYOUT_CHANGES)
def test_a_block_of_another_kv_dtype_is_a_miss(written, read):
    """Pages of another dtype or other fp8 scales on the shared volume would be wrong KV."""
    writer = _a_on_disk(**written)
    folder = str(writer.tiers.disk.files.root)
    same = make_tiered(device_pages=6, host_pages=2, disk_dir=folder, **written)
    assert serve(same, "a2", [*prompt_of(1), 5]) == 4 * BLOCK  # the files themselves are good
    reader = make_tiered(device_pages=6, host_pages=2, disk_dir=folder, **read)
    assert serve(reader, "a3", [*prompt_of(1), 5]) == 0
    assert reader.tiers.metrics["disk"].hits == 0
    for manager in (writer, reader, same):
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


FINGERPRINT = {"full": b"full/1x2x4x2x8/float32"}
READ_BLOCK_3 = """
import sys
from kvfleet.kvstore.tiers.disk_files import DiskFiles
files = DiskFiles(sys.argv[1], {"full": b"full/1x2x4x2x8/float32"})
print(files.read_into("full", 3, memoryview(bytearray(64))))
"""


def test_a_block_forged_without_the_fleet_key_is_a_miss(tmp_path):
    """If this fails, anyone who can write the shared volume can change every rank's outputs:
    a well-formed file whose tag was made without this fleet's key must never be read."""
    ours = DiskFiles(tmp_path, FINGERPRINT)
    forger = DiskFiles(tmp_path, FINGERPRINT, key=b"\x00" * 32)  # knows the format, not the key
    forger.write("full", 7, b"\x66" * 64)
    assert ours.read_into("full", 7, memoryview(bytearray(64))) is False
    assert not ours.path("full", 7).exists()
    ours.write("full", 7, b"\x01" * 64)
    out = bytearray(64)
    assert ours.read_into("full", 7, memoryview(out)) and bytes(out) == b"\x01" * 64


def test_the_fleet_secret_keys_every_folder_alike(tmp_path, monkeypatch):
    """If this fails, ranks of one fleet reject each other's blocks (or accept a foreign
    fleet's): the key comes from KVFLEET_FLEET_SECRET when set, else from the folder."""
    monkeypatch.setenv(SECRET_ENV, "fleet-a")
    writer, reader = DiskFiles(tmp_path / "a", FINGERPRINT), DiskFiles(tmp_path / "b", FINGERPRINT)
    writer.write("full", 9, b"\x02" * 64)
    reader.path("full", 9).parent.mkdir(parents=True)
    shutil.copy(writer.path("full", 9), reader.path("full", 9))
    assert reader.read_into("full", 9, memoryview(bytearray(64)))
    monkeypatch.setenv(SECRET_ENV, "fleet-b")
    other = DiskFiles(tmp_path / "b", FINGERPRINT)
    assert other.read_into("full", 9, memoryview(bytearray(64))) is False


def test_without_a_secret_blocks_stay_with_their_process(tmp_path, monkeypatch):
    """If this fails, a key kept in the shared folder lets every writer of it forge blocks:
    without a fleet secret a process's key is its own, in memory, never in the folder."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    first, second = DiskFiles(tmp_path, FINGERPRINT), DiskFiles(tmp_path, FINGERPRINT)
    first.write("full", 3, b"\x03" * 64)
    assert second.read_into("full", 3, memoryview(bytearray(64)))  # ranks of one process
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [first.path("full", 3).name]
    other_process = subprocess.run(
        [sys.executable, "-c", READ_BLOCK_3, str(tmp_path)],
        env={k: v for k, v in os.environ.items() if k != SECRET_ENV},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other_process.stdout.strip() == "False", other_process.stderr
