"""Block files written on a thread of their own, so a rank's core thread never waits on file I/O.

Writing a block file (a temporary file, its bytes, a rename) costs the thread that does it about
a millisecond a 512 KiB block; on a GPU rank that thread also plans and launches every step. Here
the caller copies the block's bytes and queues the write (on a quiet 2-core machine 0.24 ms a
block against 0.36 in place, while the files land at about half the rate: the two threads
share the interpreter; bench/disk_write_bench.py). Until the
writer thread has renamed the file into place the block is served from that copy, so it is on
the tier from the moment it is queued. Removes go through the same queue, so a block removed
right after its write is removed after it, never before.

The copies are bounded: past `MAX_PENDING_BYTES` of them the caller (`DiskTier.store`) waits
for the writer, so a slow volume costs the rank its write time, never unbounded memory.

The caller's thread is the only writer of `_pending`: it adds an entry at `write` and drops it
at `settle`, once the writer reported that very write (a sequence number tells a rewrite of the
block from the write being reported). The writer thread reads only its queue and reports on
another. The disk prefetcher's thread may look up `_pending` (one dict read, atomic in CPython).
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

from .disk_files import DiskFiles

WRITE, REMOVE, FENCE, STOP = "write", "remove", "fence", "stop"
MAX_PENDING_BYTES = 256 << 20  # queued blocks' copies: 512 1b pages, 128 of an 8b model's


class WriteBehindFiles(DiskFiles):
    """`DiskFiles` whose writes and removes run in order on a writer thread."""

    def __init__(self, *args: Any, start: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _ = self.key  # derived here, not first on the writer thread
        self._pending: dict[tuple[str, int], tuple[int, bytes, bytes]] = {}
        self.pending_bytes = 0  # of the copies in `_pending`
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._sequence = itertools.count()
        self._thread = threading.Thread(target=self._run, name="kv-disk-writer", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Start the writer thread (tests hold it back to look at queued blocks)."""
        self._thread.start()

    # -- the caller's thread -----------------------------------------------------------------

    def write(self, life_cycle: str, block_hash: int, payload, contents: bytes = b"") -> None:
        """Queue the block's file; it can be read at once. A refused write shows at `settle`."""
        if payload is None:
            raise ValueError("a block file needs the block's bytes (byte-less tiers keep none)")
        number = next(self._sequence)
        data = bytes(memoryview(payload).cast("B"))
        self._forget((life_cycle, block_hash))
        self._pending[(life_cycle, block_hash)] = (number, data, contents)
        self.pending_bytes += len(data)
        self._jobs.put((WRITE, life_cycle, block_hash, number, data, contents))

    def remove(self, life_cycle: str, block_hash: int) -> None:
        """Queue the file's removal, after any write of it queued before."""
        self._forget((life_cycle, block_hash))
        self._jobs.put((REMOVE, life_cycle, block_hash))

    def _forget(self, key: tuple[str, int]) -> None:
        entry = self._pending.pop(key, None)
        if entry is not None:
            self.pending_bytes -= len(entry[1])

    def contains(self, life_cycle: str, block_hash: int) -> bool:
        """True if the block's write is queued or its file exists."""
        return (life_cycle, block_hash) in self._pending or super().contains(life_cycle, block_hash)

    def check_into(
        self, life_cycle: str, block_hash: int, out: memoryview | None, contents: bytes = b""
    ) -> str | None:
        """A queued block from its copy (checked against `contents` as a file would be), else
        the file."""
        entry = self._pending.get((life_cycle, block_hash))
        if entry is None:
            return super().check_into(life_cycle, block_hash, out, contents)
        _, data, stored_contents = entry
        if stored_contents != contents:
            return "another block's contents under this id (an id collision, or a foreign file)"
        if out is not None:
            target = memoryview(out).cast("B")
            if len(target) != len(data):
                return f"payload of {len(data)} bytes, the layout needs {len(target)}"
            target[:] = data
        return None

    def settle(self) -> list[tuple[str, int, OSError]]:
        """Forget the copies of writes that landed; the writes the volume refused."""
        refused: list[tuple[str, int, OSError]] = []
        while True:
            try:
                key, number, error = self._done.get_nowait()
            except queue.Empty:
                return refused
            entry = self._pending.get(key)
            if entry is not None and entry[0] == number:
                self._forget(key)
            if error is not None:
                refused.append((*key, error))

    def wait(self) -> None:
        """Return once every write and remove queued so far is done (a drain's writes)."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        self._jobs.put((FENCE, done))
        done.wait()

    def close(self) -> None:
        """Finish the queued work and stop the writer thread."""
        if self._thread.is_alive():
            self._jobs.put((STOP,))
            self._thread.join()

    # -- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        while self.run_one():
            pass

    def run_one(self) -> bool:
        """Do the next queued job (the writer thread's loop; tests step a held-back writer);
        False once told to stop."""
        job = self._jobs.get()
        kind = job[0]
        if kind == STOP:
            return False
        if kind == FENCE:
            job[1].set()
        elif kind == REMOVE:
            DiskFiles.remove(self, job[1], job[2])
        else:
            _, life_cycle, block_hash, number, data, contents = job
            error = None
            try:
                DiskFiles.write(self, life_cycle, block_hash, data, contents)
            except OSError as refused:
                error = refused
            self._done.put(((life_cycle, block_hash), number, error))
        return True
