"""`kvfleet engine --fleet-secret-file` keys its disk tier with the fleet secret, and writes no
key to the shared volume (where every writer of it could read it and forge blocks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kvfleet.kvstore.tiers.disk_key import SECRET_ENV

pytestmark = pytest.mark.slow
SECRET = "fleet-secret-for-tests"


@pytest.fixture
def engine_on_disk(tmp_path):
    """A real engine process with a disk tier, its secret from a file only; yields its folder
    and what it logged up to its ready line."""
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    disk = tmp_path / "disk"
    process = subprocess.Popen(
        [sys.executable, "-m", "kvfleet.services.cli", "engine", "--model", "tiny",
         "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "-1", "--metrics-port", "-1",
         "--kv-pages", "64", "--disk-tier-dir", str(disk), "--disk-kv-gib", "0.01",
         "--fleet-secret-file", str(secret_file)],
        env={k: v for k, v in os.environ.items() if k != SECRET_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        logged = []
        for line in process.stdout:
            logged.append(line)
            if line.startswith("engine "):
                break
        assert process.poll() is None, "".join(logged)
        yield disk, "".join(logged)
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_the_disk_key_comes_from_the_secret_file_and_stays_off_the_volume(engine_on_disk):
    """With the key beside the blocks, anyone who can write the volume forges blocks every rank
    reads; with a process key instead of the fleet's, ranks could not share blocks."""
    disk, logged = engine_on_disk
    assert [p for p in disk.rglob("*") if p.is_file()] == []  # no key file, no leftovers
    assert "no fleet secret" not in logged
