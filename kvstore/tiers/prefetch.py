"""Background reads of disk blocks for queued requests.

NOTE: the worker thread only reads and checks files into buffers it owns and hands them back
through a queue; it never touches an index and never removes a file. The manager's owner thread
lands finished reads on the host tier, and counts and removes the bad files, in one place
(`KVTiers.land_prefetched`): so the tier indexes keep a single writer, and a bad file stays
findable until its miss is counted (a match that still finds it reads and rejects it itself).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Mapping

from .disk_files import DiskFiles, NoDiskFiles

BlockKey = tuple[str, int]  # (life cycle, block hash)
# A finished read: the payload, or None and why not (`disk_files.MISSING`: no file).
ReadResult = tuple[bytearray, None] | tuple[None, str]


class Prefetcher:
    """A bounded queue of disk blocks to read, one worker thread, cancellable by key."""

    def __init__(
        self,
        files: DiskFiles | NoDiskFiles,
        page_bytes: Mapping[str, int],
        max_queued_blocks: int = 256,
    ) -> None:
        if max_queued_blocks <= 0:
            raise ValueError(f"max_queued_blocks must be positive, got {max_queued_blocks}")
        self._files = files
        self._page_bytes = dict(page_bytes)
        self._jobs: queue.Queue[BlockKey | None] = queue.Queue(max_queued_blocks)
        self._done: queue.Queue[tuple[BlockKey, ReadResult, bytes]] = queue.Queue()
        self._lock = threading.Lock()
        self._wanted: set[BlockKey] = set()  # queued or being read, not cancelled
        self._contents: dict[BlockKey, bytes] = {}  # what each file must hold (disk_files.py)
        self._idle = threading.Condition(self._lock)
        self._busy = 0
        # NOTE: started on the first submit, so a manager that never prefetches has no thread.
        self._worker = threading.Thread(target=self._run, name="kv-prefetch", daemon=True)

    def in_flight(self) -> frozenset[BlockKey]:
        """Blocks queued or being read (not cancelled)."""
        with self._lock:
            return frozenset(self._wanted)

    def submit(self, key: BlockKey, contents: bytes = b"") -> bool:
        """Queue one block, whose file must hold `contents`; False if it is already in flight
        or the queue is full."""
        with self._lock:
            if key in self._wanted:
                return False
            if self._worker.ident is None:
                self._worker.start()
            try:
                self._jobs.put_nowait(key)
            except queue.Full:
                return False
            self._wanted.add(key)
            self._contents[key] = contents
            self._busy += 1
            return True

    def cancel(self, keys: Iterable[BlockKey]) -> None:
        """Drop queued blocks; a read already running finishes and its result is discarded."""
        with self._lock:
            self._wanted.difference_update(keys)

    def completed(self) -> list[tuple[BlockKey, ReadResult, bytes]]:
        """Finished reads since the last call, each with the contents its file held."""
        results = []
        while True:
            try:
                results.append(self._done.get_nowait())
            except queue.Empty:
                return results

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no read is queued or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker after the read in progress."""
        self.cancel(self.in_flight())
        if self._worker.is_alive():
            with contextlib.suppress(queue.Full):  # cancelled jobs drain fast; bounded anyway
                self._jobs.put(None, timeout=timeout_s)
            self._worker.join(timeout_s)

    def _run(self) -> None:
        while (key := self._jobs.get()) is not None:
            result: ReadResult = self._read(key) if self._still_wanted(key) else (None, "cancelled")
            with self._lock:
                contents = self._contents.pop(key, b"")
                if key in self._wanted:
                    self._wanted.discard(key)
                    self._done.put((key, result, contents))
                self._busy -= 1
                self._idle.notify_all()

    def _still_wanted(self, key: BlockKey) -> bool:
        with self._lock:
            return key in self._wanted

    def _read(self, key: BlockKey) -> ReadResult:
        buffer = bytearray(self._page_bytes.get(key[0], 0))
        if isinstance(self._files, NoDiskFiles):
            return buffer, None
        with self._lock:
            contents = self._contents.get(key, b"")
        problem = self._files.check_into(key[0], key[1], memoryview(buffer), contents)
        return (buffer, None) if problem is None else (None, problem)
