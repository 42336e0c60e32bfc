"""Two OS processes writing and reading one disk-tier folder at once."""

import subprocess
import sys
from pathlib import Path

from kvfleet.kvstore.tiers.disk_files import DiskFiles
from kvfleet.kvstore.tiers.disk_key import SECRET_ENV
from tier_disk_worker import FINGERPRINTS, NUM_BLOCKS, PAYLOAD_BYTES, payload_of

WORKER = Path(__file__).with_name("tier_disk_worker.py")


def test_two_processes_share_a_folder_without_torn_files(tmp_path, monkeypatch):
    """Concurrent writers of the same blocks must both succeed and leave intact files only
    (processes of one fleet: they share its secret, hence the block-file key)."""
    monkeypatch.setenv(SECRET_ENV, "fleet-secret-for-tests")
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tmp_path), str(seed), "600"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for seed in (1, 2)
    ]
    outputs = [worker.communicate(timeout=60)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    files = DiskFiles(tmp_path, FINGERPRINTS)
    buffer = bytearray(PAYLOAD_BYTES)
    for block_hash in range(1, NUM_BLOCKS + 1):
        assert files.read_into("full", block_hash, memoryview(buffer))
        assert bytes(buffer) == payload_of(block_hash)
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".kvb"]
    assert leftovers == []
