"""What the admission core keeps outside itself: ranks, slot reservations and pins.

Two implementations: `RedisStore` (shared by every router replica, atomic by Lua) and
`LocalStore` here (in-process: the fleet simulator, `kvfleet up` without Redis, and the router's
degraded mode). Every call takes `now` from the caller's clock so a simulator can drive time.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from .model import RankInfo, RankLoad, RankSlots


class StoreIntegrityError(RuntimeError):
    """The store's counts do not add up (a bug, never bad input)."""


@dataclass(frozen=True)
class RankRecord:
    """A rank as the store keeps it: registration, last heartbeat and the load it reported."""

    info: RankInfo
    last_heartbeat: float
    load: RankLoad


class AdmissionStore(Protocol):
    """The state every router replica must agree on.

    `try_admit` is the only call that adds a reservation; it is atomic: a rank never holds more
    than `max_batch_size` reserved slots, whoever calls.
    """

    def register_rank(self, info: RankInfo, now: float) -> None:
        """Add or replace a rank; counts as a heartbeat."""

    def heartbeat(self, rank_id: str, load: RankLoad, now: float) -> bool:
        """Record a heartbeat; False when the rank is not registered."""

    def remove_rank(self, rank_id: str) -> int:
        """Forget a rank, its reservations and the pins pointing to it; returns pins released."""

    def snapshot(self) -> dict[str, tuple[RankSlots, float]]:
        """Every rank's slots and last heartbeat time, in one read."""

    def get_pins(self, conversation_ids: Iterable[str], now: float) -> dict[str, str]:
        """The pinned rank of each conversation that has a live pin."""

    def try_admit(
        self,
        rank_id: str,
        request_id: str,
        slots: int,
        conversation_id: str,
        pin_ttl: float,
        now: float,
    ) -> bool:
        """Reserve `slots` on the rank and pin the conversation there, or do nothing."""

    def release(self, rank_id: str, request_id: str) -> None:
        """Give back a request's reserved slots (no-op when it holds none)."""

    def check_integrity(self) -> None:
        """Raise StoreIntegrityError when reservations exceed a rank or point nowhere."""


def _locked(method):
    """Run a LocalStore method under the store's lock."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class LocalStore:
    """In-process store: plain dicts, one writer (its caller), same rules as RedisStore."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # heartbeats, finishes and passes come from many threads
        self._ranks: dict[str, RankRecord] = {}
        self._reservations: dict[str, dict[str, int]] = {}
        self._pins: dict[str, tuple[str, float]] = {}  # conversation -> (rank, expires_at)

    @_locked
    def register_rank(self, info: RankInfo, now: float) -> None:
        previous = self._ranks.get(info.rank_id)
        load = previous.load if previous else RankLoad(free_slots=info.max_batch_size)
        self.put_rank(RankRecord(info, now, load))

    @_locked
    def put_rank(self, record: RankRecord) -> None:
        """Add or replace a rank record as given (mirroring another store)."""
        self._ranks[record.info.rank_id] = record
        self._reservations.setdefault(record.info.rank_id, {})

    @_locked
    def heartbeat(self, rank_id: str, load: RankLoad, now: float) -> bool:
        record = self._ranks.get(rank_id)
        if record is None:
            return False
        self._ranks[rank_id] = RankRecord(record.info, now, load)
        return True

    @_locked
    def remove_rank(self, rank_id: str) -> int:
        self._ranks.pop(rank_id, None)
        self._reservations.pop(rank_id, None)
        doomed = [conv for conv, (rank, _) in self._pins.items() if rank == rank_id]
        for conv in doomed:
            del self._pins[conv]
        return len(doomed)

    @_locked
    def snapshot(self) -> dict[str, tuple[RankSlots, float]]:
        return {
            rank_id: (
                RankSlots(record.info, self._used(rank_id), record.load),
                record.last_heartbeat,
            )
            for rank_id, record in self._ranks.items()
        }

    @_locked
    def get_pins(self, conversation_ids: Iterable[str], now: float) -> dict[str, str]:
        pins = {}
        for conv in conversation_ids:
            entry = self._pins.get(conv)
            if entry is None:
                continue
            if entry[1] <= now:
                del self._pins[conv]
                continue
            pins[conv] = entry[0]
        return pins

    @_locked
    def try_admit(
        self,
        rank_id: str,
        request_id: str,
        slots: int,
        conversation_id: str,
        pin_ttl: float,
        now: float,
    ) -> bool:
        record = self._ranks.get(rank_id)
        if record is None or self._used(rank_id) + slots > record.info.max_batch_size:
            return False
        self._reservations[rank_id][request_id] = slots
        if conversation_id:
            self._pins[conversation_id] = (rank_id, now + pin_ttl)
        return True

    @_locked
    def release(self, rank_id: str, request_id: str) -> None:
        self._reservations.get(rank_id, {}).pop(request_id, None)

    @_locked
    def expire_pins(self, now: float) -> int:
        """Forget pins whose time is up; returns how many."""
        expired = [conv for conv, (_, expires_at) in self._pins.items() if expires_at <= now]
        for conv in expired:
            del self._pins[conv]
        return len(expired)

    # Used by FailoverStore to mirror and to resync Redis.
    @_locked
    def set_pin(self, conversation_id: str, rank_id: str, expires_at: float) -> None:
        """Record a pin seen elsewhere (no reservation)."""
        self._pins[conversation_id] = (rank_id, expires_at)

    @_locked
    def pins(self) -> dict[str, tuple[str, float]]:
        """Every pin with its expiry time."""
        return dict(self._pins)

    @_locked
    def ranks(self) -> dict[str, RankRecord]:
        """Every rank record."""
        return dict(self._ranks)

    @_locked
    def reservations(self) -> dict[str, dict[str, int]]:
        """request id -> slots, per rank."""
        return {rank: dict(held) for rank, held in self._reservations.items()}

    @_locked
    def check_integrity(self) -> None:
        for rank_id, held in self._reservations.items():
            record = self._ranks.get(rank_id)
            if record is None:
                raise StoreIntegrityError(f"{len(held)} reservations on unknown rank {rank_id}")
            used = sum(held.values())
            if used > record.info.max_batch_size:
                raise StoreIntegrityError(
                    f"rank {rank_id}: {used} slots reserved > max_batch_size "
                    f"{record.info.max_batch_size}"
                )
        for conv, (rank_id, _) in self._pins.items():
            if rank_id not in self._ranks:
                raise StoreIntegrityError(f"pin {conv} -> unknown rank {rank_id}")

    def _used(self, rank_id: str) -> int:
        return sum(self._reservations.get(rank_id, {}).values())
