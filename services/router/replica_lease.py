"""A router replica's lease on its slot reservations in Redis.

Each reservation field names its replica (`<replica>|<request>`). A replica keeps a lease key
`P:replica:<id>` alive (renewed every third of the lease); every replica deletes, on the same
beat, the reservations of replicas whose lease lapsed, so a killed replica's slots come back
within about one lease and a third. A replica starting under an id (a pod name, stable across
restarts) first deletes the reservations left under that id; a clean stop deletes its own.

A replica whose lease is gone while it lives (cut off from Redis or stalled past its lease, or
Redis restarted empty) finds out at its next renewal, or at once when it admits or reads pins
(`LeaseLost`): it turns degraded, and its recovery writes its ranks, pins and reservations back
and takes the lease with the reservations, in one script (numbered against its own releases, so
none released meanwhile comes back: `reservation_order.py`), before it reaps anyone again.
So a lease in Redis always comes with its replica's reservations, and reaping by lease never
takes a live replica's.
"""

from __future__ import annotations

import logging
import threading

import redis

from .failover_store import FailoverStore

log = logging.getLogger(__name__)


class ReplicaLease:
    """Renews this replica's lease and reaps lapsed replicas' reservations, on its own thread."""

    def __init__(self, store: FailoverStore, lease_seconds: float) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds: {lease_seconds} <= 0")
        self._store = store
        self._lease = lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="router-lease", daemon=True)
        store.remote.lease_ms = int(lease_seconds * 1000)
        self.reaped = 0  # reservations of lapsed replicas deleted by this replica

    def start(self) -> ReplicaLease:
        """Clear what an earlier life of this id left, take the lease, start renewing."""
        remote = self._store.remote
        try:
            cleared = remote.clear_own()
            if cleared:
                log.warning("replica %s: %d reservations of its last run cleared", remote.owner,
                            cleared)  # fmt: skip
            remote.renew_lease(self._lease)
            self.beat()  # learn the other replicas now: an outage may come before the next beat
        except redis.RedisError as error:
            log.warning("replica %s: no lease yet (%s)", remote.owner, error)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing and give the lease and any reservation left back."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._store.remote.clear_own()
        except redis.RedisError as error:
            log.warning("replica %s: lease not given back (%s)", self._store.remote.owner, error)

    def _run(self) -> None:
        while not self._stop.wait(self._lease / 3):
            try:
                self.beat()
            except redis.RedisError as error:  # the failover store notices outages itself
                log.debug("lease beat failed: %s", error)

    def beat(self) -> None:
        """Renew the lease once and reap lapsed replicas' reservations."""
        if self._store.degraded:
            return  # the recovery writes this replica's state back and takes the lease first
        remote = self._store.remote
        if not remote.renew_lease(self._lease, only_if_held=True):
            self._store.lease_lost("lease gone at its renewal")
            return
        reaped, live = remote.reap_lapsed()
        self._store.live_replicas = live
        if reaped:
            self.reaped += reaped
            log.warning("reservations of %d requests of lapsed replicas released", reaped)
