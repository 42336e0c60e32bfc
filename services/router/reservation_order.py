"""Numbers a replica's reservation changes, so a write-back from its mirror never undoes one.

A replica writes its reservations back to Redis from its local mirror (its lease lapsed and
another replica reaped them, or Redis came back). The mirror is read, then written: a release
that lands in Redis between the two would be written back, and nothing would ever release it
again. So every admission and release of this replica takes a number (`seq`) before it goes to
Redis, and Redis keeps the highest number that reached it (`P:seq:<replica>`); a write-back
carries the number its snapshot was taken at and is refused, atomically, when a newer change
already reached Redis, or a newer snapshot was written back (which carries the changes made
while Redis was away); then it is taken again. Admissions in flight when the snapshot is taken
(in Redis perhaps, in the mirror not yet) are named in the snapshot and left alone.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .store import LocalStore


@dataclass(frozen=True)
class WritebackPlan:
    """This replica's reservations at change number `seq`, and the requests being admitted."""

    seq: int
    held: dict[str, dict[str, int]]  # rank -> request -> slots
    in_flight: frozenset[str]  # request ids whose admission has not reached the mirror yet


class ReservationOrder:
    """The change counter of one replica and its mirror's snapshot, taken under one lock."""

    def __init__(self, local: LocalStore) -> None:
        self._local = local
        self._lock = threading.Lock()
        self._seq = 0
        self._admitting: Counter[str] = Counter()

    def begin_admit(self, request_id: str) -> int:
        """An admission is about to go to Redis: its number."""
        with self._lock:
            self._seq += 1
            self._admitting[request_id] += 1
            return self._seq

    def end_admit(self, request_id: str, record: Callable[[], bool]) -> bool:
        """The admission is decided: `record` mirrors it (or not); returns what it returns."""
        with self._lock:
            try:
                return record()
            finally:
                self._admitting[request_id] -= 1
                if self._admitting[request_id] <= 0:
                    del self._admitting[request_id]

    def release(self, record: Callable[[], None]) -> int:
        """Mirror a release (`record`) and number it, before it goes to Redis."""
        with self._lock:
            record()
            self._seq += 1
            return self._seq

    def plan(self) -> WritebackPlan:
        """A snapshot of the mirror's reservations to write back."""
        with self._lock:
            return WritebackPlan(self._seq, self._local.reservations(), frozenset(self._admitting))
