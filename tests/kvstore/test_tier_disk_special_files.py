"""A FIFO (or any non-regular file) where a block file should be is a miss, never a hang."""

import contextlib
import logging
import os
import threading

from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.tiers.disk_files import DiskFiles
from tier_factories import BLOCK, make_tiered, prompt_of, serve

FINGERPRINT = {"full": b"full/1x2x4x2x8/float32"}
HANG_BOUND_S = 60.0  # only a broken build waits this long: a blocking open never returns


def _fifo_instead_of(path) -> None:
    path.unlink()
    os.mkfifo(path)


def _run_bounded(work) -> tuple[dict, threading.Thread]:
    """Run `work` on a thread; if it is stuck on a FIFO past the bound, unstick it (a writer
    that closes at once gives the reader EOF) so the failing test does not leak the thread."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=work()), daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    result["hung"] = thread.is_alive()
    return result, thread


def _unstick(path, thread) -> None:
    while thread.is_alive():
        with contextlib.suppress(OSError):  # no reader yet: ENXIO
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(0.1)


def test_a_fifo_in_place_of_a_block_file_is_a_counted_miss(caplog):
    """Opened blocking, a FIFO with no writer would hold the rank's core thread forever."""
    manager = make_tiered(device_pages=6, host_pages=2)
    serve(manager, "a", prompt_of(1))
    for seed in range(2, 5):
        serve(manager, f"push{seed}", prompt_of(seed))
    path = manager.tiers.disk.files.path("full", block_hashes(prompt_of(1), BLOCK)[2])
    _fifo_instead_of(path)
    with caplog.at_level(logging.WARNING):
        result, thread = _run_bounded(lambda: serve(manager, "a2", [*prompt_of(1), 5]))
    _unstick(path, thread)
    assert not result["hung"], "reading the disk tier blocked on a FIFO"
    assert result["value"] == 2 * BLOCK  # the blocks before it are still reused
    assert manager.tiers.metrics["disk"].refused_files == 1
    assert path.exists()  # left alone: not ours to delete
    assert "not a block file" in caplog.text
    manager.check_integrity()
    manager.tiers.close()


def test_non_regular_files_are_logged_once(tmp_path, caplog):
    """A folder full of FIFOs must not flood the log: the first is logged, the rest counted."""
    files = DiskFiles(tmp_path, FINGERPRINT, key=b"\x01" * 32)
    for block_hash in (1, 2, 3):
        files.path("full", block_hash).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(files.path("full", block_hash))
    with caplog.at_level(logging.WARNING):
        for block_hash in (1, 2, 3):
            result, thread = _run_bounded(
                lambda h=block_hash: files.read_into("full", h, memoryview(bytearray(64)))
            )
            _unstick(files.path("full", block_hash), thread)
            assert result == {"value": False, "hung": False}
    assert caplog.text.count("not a block file") == 1
