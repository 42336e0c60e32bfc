"""The router's admission loop: one thread runs passes; gRPC handlers wait on tickets.

The admission lock guards the queues and tickets only: passes hold it (their store calls may
wait on Redis), arrivals and cancels take it briefly. Finishes, registrations, heartbeats and KV
events never take it: the stores are safe to call from several threads and the prefix index
locks itself, so a pass stuck on a hung Redis does not hold them up. Passes run when something
changes (arrival, release, registration) and on a short tick, which also removes silent ranks;
while degraded, a thread of its own retries Redis.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .admission import AdmissionQueue
from .errors import QueueTimeout, RankUnavailable, RouterError
from .failover_store import FailoverStore
from .metrics import RouterMetrics
from .model import Admission, PendingRequest, RankInfo, RankLoad, RankSlots
from .prefix_index import PrefixIndex
from .store import AdmissionStore

log = logging.getLogger(__name__)


@dataclass
class Ticket:
    """A caller's handle on a queued request: set once, to an admission or an error."""

    request: PendingRequest
    done: threading.Event = field(default_factory=threading.Event)
    admission: Admission | None = None
    error: RouterError | None = None

    def wait(self, timeout: float) -> bool:
        """Block until decided or timeout; True when decided."""
        return self.done.wait(timeout)


class RouterRuntime:
    """Owns the admission queue and its thread; the gRPC servicers call in here."""

    def __init__(
        self,
        queue: AdmissionQueue,
        prefix_index: PrefixIndex,
        metrics: RouterMetrics,
        clock: Callable[[], float],
        max_queue_seconds: float = 600.0,
        tick_seconds: float = 0.05,
        recover_every_seconds: float = 0.5,
        generation_queue: AdmissionQueue | None = None,
        resync_grace_seconds: float | None = None,
        pin_sweep_seconds: float = 10.0,
    ) -> None:
        self.pin_sweep_seconds = pin_sweep_seconds  # how often expired pins are dropped
        self._last_pin_sweep = 0.0
        self.resync_grace_seconds = resync_grace_seconds  # None: one heartbeat timeout
        self.queue = queue
        # Disaggregation: a turn admitted on a context rank is placed again, on a generation
        # rank, by this second queue over the same store (so both placements are atomic).
        self.generation_queue = generation_queue
        self._queues = {"context": queue}
        if generation_queue is not None:
            self._queues["generation"] = generation_queue
        self.store = queue.store
        self.prefix_index = prefix_index
        self.metrics = metrics
        self._clock = clock
        self._max_queue_seconds = max_queue_seconds
        self._tick = tick_seconds
        self.recover_every_seconds = recover_every_seconds
        self.last_housekeeping_at = 0.0
        self._lock = threading.Lock()  # the admission lock: queues and tickets
        self._poke = threading.Event()  # something changed: run a pass now
        self._stop_event = threading.Event()
        self._draining_lock = threading.Lock()
        # Called with a rank id whenever this router removes a rank (its calls are cancelled).
        self.removal_listeners: list[Callable[[str], None]] = []
        # Called after each pass of the context queue with its waiting requests (prefetch).
        self.after_pass: list[Callable[[list[PendingRequest], AdmissionStore, dict, float], None]]
        self.after_pass = []
        self._tickets: dict[str, Ticket] = {}
        self._draining: set[str] = set()  # ranks last heard draining (for the log only)
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="router-admission", daemon=True)
        self._recovery = threading.Thread(
            target=self._recover_loop, name="router-redis-recovery", daemon=True
        )

    @property
    def max_queue_seconds(self) -> float:
        """How long a request may wait for a slot before it fails."""
        return self._max_queue_seconds

    @property
    def degraded(self) -> bool:
        """True while the shared store is away."""
        return isinstance(self.store, FailoverStore) and self.store.degraded

    def start(self) -> None:
        self._thread.start()
        self._recovery.start()

    def stop(self) -> None:
        """Stop the loop and fail whatever still waits, so no caller hangs."""
        with self._lock:
            self._stopped = True
            self._stop_event.set()
            for ticket in self._tickets.values():
                self._decide(ticket, error=RankUnavailable("router is shutting down"))
            self._tickets.clear()
        self._poke.set()
        self._thread.join(timeout=5)
        self._recovery.join(timeout=5)

    def submit(self, request: PendingRequest, pool: str = "context") -> Ticket:
        """Queue a request for a pool (`context`, or `generation` for the hand-off placement);
        the returned ticket is decided by a later pass."""
        ticket = Ticket(request)
        with self._lock:
            if self._stopped:
                self._decide(ticket, error=RankUnavailable("router is shutting down"))
                return ticket
            if pool not in self._queues:
                self._decide(ticket, error=RankUnavailable(f"this router has no {pool} pool"))
                return ticket
            self._queues[pool].enqueue(request)
            self._tickets[request.request_id] = ticket
        self._poke.set()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Withdraw a waiting request (client went away); no-op once decided."""
        with self._lock:
            request_id = ticket.request.request_id
            if any(queue.cancel(request_id) for queue in self._queues.values()):
                self._tickets.pop(request_id, None)

    # NOTE: finishes, registrations, heartbeats and KV events never take the admission lock: a
    # pass may be waiting on a hung Redis, and they must not wait with it. The stores are safe
    # to call from several threads, and the prefix index locks itself.
    def finish(self, admission: Admission) -> None:
        """Give back the slots of a request that ended, for any reason."""
        self.store.release(admission.rank.rank_id, admission.request.request_id)
        self._poke.set()

    def register(self, info: RankInfo) -> None:
        self.store.register_rank(info, self._clock())
        self.prefix_index.clear(info.rank_id)
        self._poke.set()

    def heartbeat(self, rank_id: str, load: RankLoad) -> bool:
        known = self.store.heartbeat(rank_id, load, self._clock())
        with self._draining_lock:
            changed = known and load.draining != (rank_id in self._draining)
            if changed:
                self._draining ^= {rank_id}
        if changed:
            log.info("rank %s %s", rank_id, "draining" if load.draining else "drain ended")
        return known

    def rank_failed(self, rank_id: str, reason: str) -> None:
        """Remove a rank that failed a forwarded call; it registers again when it recovers.

        A leaving rank (shutting down) is kept: it refuses new calls while its streams run out
        their grace, and removing it would cancel them; it goes when its heartbeats stop."""
        entry = self.store.snapshot().get(rank_id)
        if entry is not None and entry[0].load.leaving:
            log.info("rank %s is leaving and refused a call (%s); kept for its streams", rank_id,
                     reason)  # fmt: skip
            return
        released = self.store.remove_rank(rank_id)
        self.prefix_index.clear(rank_id)
        self.metrics.ranks_removed.inc()
        log.warning("rank %s removed (%s); %d pins released", rank_id, reason, released)
        self._removed(rank_id)
        self._poke.set()

    def _removed(self, rank_id: str) -> None:
        for listener in self.removal_listeners:
            listener(rank_id)

    def ranks(self) -> dict[str, RankSlots]:
        """Every rank with its slots now."""
        return {rank_id: slots for rank_id, (slots, _) in self.store.snapshot().items()}

    def live_info(self, rank_id: str, timeout: float) -> RankInfo | None:
        """What a registered rank heard from within `timeout` seconds registered, else None."""
        entry = self.store.snapshot().get(rank_id)
        if entry is None or self._clock() - entry[1] > timeout:
            return None
        return entry[0].info

    def with_prefix_index(self, apply: Callable[[PrefixIndex], object]) -> object:
        """Run a change on the prefix index as one step (KV events)."""
        return self.prefix_index.atomically(apply)

    def _loop(self) -> None:
        while not self._stopped:
            self._poke.clear()  # before the pass: a change during it wakes the next one
            try:
                self._housekeeping()
                with self._lock:
                    for queue in self._queues.values():
                        if len(queue) and not self._stopped:
                            self._admit(queue)
            except Exception:  # keep the loop alive; the failure is logged, then retried
                log.exception("admission pass failed")
            self._poke.wait(self._tick)

    def _recover_loop(self) -> None:
        """While degraded, try Redis again now and then, on a thread of its own: a hung Redis
        holds up this thread alone, never admissions."""
        while not self._stopped:
            if self.degraded:
                try:
                    self.store.try_recover(self._clock())
                except Exception:  # the next try comes; the failure is logged
                    log.exception("redis recovery failed")
            self._stop_event.wait(self.recover_every_seconds)

    def _in_resync_grace(self, now: float) -> bool:
        """Within one heartbeat timeout of Redis coming back: no rank counts as silent yet.

        NOTE: ranks that heartbeat to another replica look silent here until that replica is
        back too (its heartbeats land in its local state meanwhile); they get the timeout."""
        recovered_at = getattr(self.store, "recovered_at", None)
        grace = self.resync_grace_seconds
        if grace is None:
            grace = self.queue.config.heartbeat_timeout_seconds
        return recovered_at is not None and now - recovered_at < grace

    def _housekeeping(self) -> None:
        now = self._clock()
        self.last_housekeeping_at = now
        if now - self._last_pin_sweep >= self.pin_sweep_seconds:
            self._last_pin_sweep = now
            expire = getattr(self.store, "expire_pins", None)
            if expire is not None:
                expire(now)
        if self.degraded:
            return
        if self._in_resync_grace(now):
            return
        # NOTE: silent ranks are not swept while degraded: their heartbeats may be landing on
        # another replica that this one cannot hear from without Redis.
        for rank_id in self.queue.remove_silent_ranks():
            self.prefix_index.clear(rank_id)
            self.metrics.ranks_removed.inc()
            log.warning("rank %s removed: no heartbeat", rank_id)
            self._removed(rank_id)

    def _admit(self, queue: AdmissionQueue) -> None:
        result = queue.run_pass(degraded=self.degraded)
        now = self._clock()
        for admission in result.admitted:
            ticket = self._tickets.pop(admission.request.request_id, None)
            if ticket is None:  # cancelled in the meantime
                self.store.release(admission.rank.rank_id, admission.request.request_id)
                continue
            self.metrics.admission_wait.observe(now - admission.request.enqueued_at)
            self._decide(ticket, admission=admission)
        for request, reason in result.failed:
            ticket = self._tickets.pop(request.request_id, None)
            if ticket:
                self._decide(ticket, error=RankUnavailable(reason))
        for request in queue.waiting():
            if now - request.enqueued_at > self._max_queue_seconds:
                queue.cancel(request.request_id)
                ticket = self._tickets.pop(request.request_id, None)
                if ticket:
                    self._decide(
                        ticket,
                        error=QueueTimeout(
                            f"no slot for {request.slots} within {self._max_queue_seconds:g} s"
                        ),
                    )
        self.metrics.record_pass(result, sum(len(q) for q in self._queues.values()))
        if self.after_pass and queue is self.queue and len(queue):
            waiting, ranks = queue.waiting(), self.ranks()
            for listener in self.after_pass:
                listener(waiting, self.store, ranks, now)

    @staticmethod
    def _decide(
        ticket: Ticket, admission: Admission | None = None, error: RouterError | None = None
    ) -> None:
        ticket.admission = admission
        ticket.error = error
        ticket.done.set()
