"""Redis first, local state when Redis is away, and a resync when it returns.

Safe to call from several threads: the mirror locks itself, and no lock is held over a Redis
call (a hung Redis holds up the calling thread alone).

While Redis answers, every change is also kept in a local mirror (ranks, pins seen, this
router's own reservations). When a Redis call fails the store turns degraded: calls go to the
mirror, and the router admits with lenient affinity on its share of each rank's slots (it can no
longer see other replicas' reservations, so the replicas split the slots rather than each
taking all). `try_recover` writes the mirror back once Redis answers again.

Reservation changes are numbered (`reservation_order.py`), so a write-back of the mirror
never brings back a reservation released while the write-back was on its way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis

from .model import RankInfo, RankLoad, RankSlots
from .redis_store import LeaseLost, RedisStore
from .reservation_order import ReservationOrder, WritebackPlan
from .store import LocalStore, RankRecord

T = TypeVar("T")

log = logging.getLogger(__name__)


class FailoverStore:
    """AdmissionStore over a RedisStore with a LocalStore mirror for outages."""

    def __init__(
        self,
        remote: RedisStore,
        pin_ttl_seconds: float,
        on_redis_error: Callable[[Exception], None] = lambda _error: None,
        on_degraded: Callable[[bool], None] = lambda _degraded: None,
    ) -> None:
        self.remote = remote
        self.local = LocalStore()
        self._order = ReservationOrder(self.local)
        self._pin_ttl = pin_ttl_seconds
        self._on_redis_error = on_redis_error
        self._on_degraded = on_degraded
        self.degraded = False
        # Why Redis last failed while degraded (the last retry's error: a wrong password says
        # so here until fixed); None while Redis answers.
        self.degraded_reason: str | None = None
        self._flag_lock = threading.Lock()  # degraded turns on or off once per outage
        self.recovered_at: float | None = None  # `now` of the last resync
        self.live_replicas: list[str] = []  # replica ids holding a lease, at the last beat
        self._degraded_at = 0.0  # time.monotonic() when the last outage began
        # Degraded while Redis answers (this replica's lease was gone, or it waits for the
        # other replicas to write their state back): admit nothing rather than a share, since
        # Redis is about to count every replica's reservations again and the shares do not
        # count those made before the outage.
        self._holding = False
        self._others_used: dict[str, int] = {}  # rank -> other replicas' slots, last seen

    def _remote_call(self, call: Callable[[], T]) -> tuple[bool, T | None]:
        """Run a Redis call unless degraded; (False, None) when Redis is away."""
        if self.degraded:
            return False, None
        try:
            return True, call()
        except redis.RedisError as error:
            self._on_redis_error(error)
            if isinstance(error, LeaseLost):
                self._holding = True
            self._set_degraded(True, _reason(error))
            return False, None

    def _set_degraded(self, degraded: bool, reason: str) -> None:
        with self._flag_lock:
            self.degraded_reason = reason if degraded else None
            if degraded == self.degraded:
                return
            self.degraded = degraded
            if degraded:
                self._degraded_at = time.monotonic()
            else:
                self._holding = False
        if degraded:
            log.warning(
                "redis unreachable (%s): serving from local state, lenient affinity", reason
            )
        else:
            log.warning("redis back (%s): local state written back, affinity restored", reason)
        self._on_degraded(degraded)

    def lease_lost(self, reason: str) -> None:
        """This replica's lease is gone from Redis: serve from the mirror until the recovery
        has written its state back (see replica_lease.py)."""
        self._holding = True
        self._set_degraded(True, f"LeaseLost: {reason}")

    def register_rank(self, info: RankInfo, now: float) -> None:
        self.local.register_rank(info, now)
        self._remote_call(lambda: self.remote.register_rank(info, now))

    def heartbeat(self, rank_id: str, load: RankLoad, now: float) -> bool:
        known_locally = self.local.heartbeat(rank_id, load, now)
        ok, known = self._remote_call(lambda: self.remote.heartbeat(rank_id, load, now))
        return bool(known) if ok else known_locally

    def remove_rank(self, rank_id: str) -> int:
        released_locally = self.local.remove_rank(rank_id)
        ok, released = self._remote_call(lambda: self.remote.remove_rank(rank_id))
        return int(released) if ok and released is not None else released_locally

    def snapshot(self) -> dict[str, tuple[RankSlots, float]]:
        ok, remote = self._remote_call(self.remote.snapshot)
        if not ok or remote is None:
            return self.local.snapshot()
        own = self.local.reservations()
        # NOTE: what the other replicas held when Redis was last seen, counted against this
        # replica's share while degraded (a release racing this read only makes it larger).
        self._others_used = {
            rank_id: max(0, slots.used - sum(own.get(rank_id, {}).values()))
            for rank_id, (slots, _) in remote.items()
        }
        known = self.local.ranks()
        for slots, last_heartbeat in remote.values():
            self.local.put_rank(RankRecord(slots.info, last_heartbeat, slots.load))
        for rank_id in known.keys() - remote.keys():
            self.local.remove_rank(rank_id)
        return remote

    def get_pins(self, conversation_ids: Iterable[str], now: float) -> dict[str, str]:
        conversations = list(conversation_ids)
        ok, remote = self._remote_call(lambda: self.remote.get_pins(conversations, now))
        if not ok or remote is None:
            return self.local.get_pins(conversations, now)
        local = self.local.get_pins(remote.keys(), now)
        for conv, rank_id in remote.items():
            if local.get(conv) != rank_id:
                self.local.set_pin(conv, rank_id, now + self._pin_ttl)
        return remote

    def try_admit(
        self,
        rank_id: str,
        request_id: str,
        slots: int,
        conversation_id: str,
        pin_ttl: float,
        now: float,
    ) -> bool:
        seq = self._order.begin_admit(request_id)
        outcome: tuple[bool, bool | None] | None = None  # None: an unexpected error

        def record() -> bool:
            if outcome is None:
                return False
            ok, admitted = outcome
            if ok and not admitted:
                return False
            if not ok and (self._holding or not self._fits_share(rank_id, slots)):
                return False
            mirrored = self.local.try_admit(rank_id, request_id, slots, conversation_id, pin_ttl,
                                            now)  # fmt: skip
            if ok and not mirrored:
                log.error("local mirror refused %s on %s that redis admitted", request_id, rank_id)
            return True if ok else mirrored

        try:
            outcome = self._remote_call(
                lambda: self.remote.try_admit(
                    rank_id, request_id, slots, conversation_id, pin_ttl, now, seq
                )
            )
        finally:
            # NOTE: mirrored under the order lock, so no write-back snapshot falls in between.
            admitted = self._order.end_admit(request_id, record)
        return admitted

    def share(self, rank_id: str) -> int:
        """This replica's part of a rank's slots while degraded: the rank's slots split over
        the replicas that held a lease when Redis was last seen (this one counted in), the
        remainder to the first ids, so the replicas together never exceed the rank."""
        record = self.local.ranks().get(rank_id)
        if record is None:
            return 0
        replicas = sorted(set(self.live_replicas) | {self.remote.owner})
        base, extra = divmod(record.info.max_batch_size, len(replicas))
        return base + (1 if replicas.index(self.remote.owner) < extra else 0)

    def _fits_share(self, rank_id: str, slots: int) -> bool:
        """Within this replica's share, and within what the others left free when Redis was
        last seen: they may hold more than their share from before the outage (they admit no
        more until under it), so theirs never fall below min(then, their shares)."""
        record = self.local.ranks().get(rank_id)
        if record is None:
            return False
        held = sum(self.local.reservations().get(rank_id, {}).values())
        others = self._others_used.get(rank_id, 0)
        room = min(self.share(rank_id), record.info.max_batch_size - others)
        return held + slots <= room

    def release(self, rank_id: str, request_id: str) -> None:
        seq = self._order.release(lambda: self.local.release(rank_id, request_id))
        self._remote_call(lambda: self.remote.release(rank_id, request_id, seq))

    def writeback_plan(self) -> WritebackPlan:
        """A snapshot of this replica's reservations, numbered, for `RedisStore.write_back`."""
        return self._order.plan()

    def write_back_reservations(self) -> None:
        """Write this replica's reservations back to Redis from the mirror, taking a fresh
        snapshot each time one is refused as stale (a change raced it)."""
        while not self.remote.write_back(self.writeback_plan()):
            log.debug("reservation write-back raced a change; taken again")

    def expire_pins(self, now: float) -> int:
        """Forget expired pins in the mirror, and trim Redis's per-rank pin sets."""
        expired = self.local.expire_pins(now)
        self._remote_call(lambda: self.remote.expire_pins(now))
        return expired

    def try_recover(self, now: float) -> bool:
        """When degraded and Redis answers: write the local state back; True when recovered."""
        if not self.degraded:
            return False
        try:
            self.remote.ping()
            if not self.remote.resync(
                self.local.ranks(), self.local.pins(), self.writeback_plan(), now
            ):
                self.write_back_reservations()
            if self._others_not_back():
                self._holding = True
                return False
        except redis.RedisError as error:
            self._on_redis_error(error)
            self.degraded_reason = _reason(error)
            return False
        self.recovered_at = now
        self._set_degraded(False, "resync done")
        # NOTE: admissions and finishes made locally while the resync ran are written now.
        self._remote_call(self.write_back_reservations)
        return True

    def _others_not_back(self) -> bool:
        """True while a replica that held a lease before the outage has not written its state
        back yet (within one lease of the outage): until then Redis does not count its
        reservations, so this replica keeps to its share."""
        lease_ms = self.remote.lease_ms
        if not lease_ms or time.monotonic() - self._degraded_at >= lease_ms / 1000:
            return False
        others = set(self.live_replicas) - {self.remote.owner}
        missing = self.remote.missing_leases(others)
        if missing:
            log.info("redis back; waiting for replicas %s to write their state back", missing)
        return bool(missing)

    def check_integrity(self) -> None:
        self.local.check_integrity()
        self._remote_call(self.remote.check_integrity)


def _reason(error: Exception) -> str:
    """What /health and the log say of a Redis failure (redis-py's messages hold no secret)."""
    return f"{type(error).__name__}: {error}"
