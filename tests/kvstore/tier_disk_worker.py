"""One OS process hammering a shared disk-tier folder (run by test_tier_multiprocess.py).

Usage: python tier_disk_worker.py FOLDER SEED ROUNDS. Writes and reads the same block ids as its
sibling process; exits 1 if any read returned wrong bytes or any file failed its checks.
"""

from __future__ import annotations

import logging
import random
import sys

from kvfleet.kvstore.tiers.disk_files import DiskFiles

FINGERPRINTS = {"full": b"full/test-layout"}
NUM_BLOCKS = 24
PAYLOAD_BYTES = 64 * 1024


def payload_of(block_hash: int) -> bytes:
    """The only bytes a block may ever hold."""
    return random.Random(block_hash).randbytes(PAYLOAD_BYTES)


class CountWarnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(folder: str, seed: int, rounds: int) -> int:
    warnings = CountWarnings()
    logging.getLogger("kvfleet").addHandler(warnings)
    files = DiskFiles(folder, FINGERPRINTS)
    rng = random.Random(seed)
    wrong = 0
    buffer = bytearray(PAYLOAD_BYTES)
    for _ in range(rounds):
        block_hash = rng.randrange(NUM_BLOCKS) + 1
        if rng.random() < 0.5:
            files.write("full", block_hash, payload_of(block_hash))
        elif files.read_into("full", block_hash, memoryview(buffer)):
            wrong += bytes(buffer) != payload_of(block_hash)
    print(f"wrong={wrong} warnings={warnings.messages[:3]}")
    return 1 if wrong or warnings.messages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
