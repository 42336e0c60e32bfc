"""A rank's link to the router: Register, periodic Heartbeat with load, PublishKvEvents.

Two threads: one registers (retrying until the router answers) and heartbeats, registering
again when a reply says the router forgot the rank; one streams KV event batches from a queue
that the engine core fills (never blocking the core).

The router address may name several replicas (`host:port,host:port`; they share one Redis,
where a heartbeat counts for every replica). A heartbeat or registration that fails or times
out drops the connection and dials the next address (with one address: a new connection, which
a Service may send to another replica), and the rank registers there: a hung replica, whose
connection stays open and answers nothing, must not keep the rank silent to the others until
they remove it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

import grpc

from ....kvstore.events import KVEventKind
from ....proto import common_pb2, router_pb2, router_pb2_grpc
from ...router.fleet_secret import KV_BATCH_BYTES, secret_metadata
from ..core.kv_events import BlockEvent
from ..request.engine_request import EngineLoad

log = logging.getLogger(__name__)

ROLES = {
    "both": common_pb2.RANK_ROLE_BOTH,
    "context": common_pb2.RANK_ROLE_CONTEXT,
    "generation": common_pb2.RANK_ROLE_GENERATION,
}
RETRY_SECONDS = 0.5
# A call's deadline: this, or the heartbeat interval when shorter, so that a hung router is
# left (and another dialled, at once) well within the router's heartbeat timeout (3 intervals).
RPC_TIMEOUT_SECONDS = 2.0
# How often a KV event stream that waits for events checks whether its call or the link ended.
QUEUE_POLL_SECONDS = 0.5


def event_proto(event: BlockEvent) -> router_pb2.KvEvent:
    """One BlockEvent as the router's KvEvent."""
    if event.kind == KVEventKind.STORED:
        stored = router_pb2.BlocksStored(
            block_hashes=[event.block_hash], token_ids=list(event.token_ids)
        )
        if event.parent_hash is not None:
            stored.parent_block_hash = event.parent_hash
        elif event.root_hash is not None:
            stored.root_hash = event.root_hash
        return router_pb2.KvEvent(stored=stored)
    return router_pb2.KvEvent(removed=router_pb2.BlocksRemoved(block_hashes=[event.block_hash]))


class RouterLink:
    """Registers a rank, heartbeats its load and publishes its KV events."""

    def __init__(
        self,
        router_address: str,
        rank_id: str,
        advertise_address: str,
        max_batch_size: int,
        role: str,
        block_size: int,
        load: Callable[[], EngineLoad],
        draining: Callable[[], bool] = lambda: False,
        fleet_secret: str | None = None,
        leaving: Callable[[], bool] = lambda: False,
    ) -> None:
        self.rank_id = rank_id
        self._addresses = [a.strip() for a in router_address.split(",") if a.strip()]
        if not self._addresses:
            raise ValueError(f"router_address: {router_address!r} names no address")
        self._metadata = secret_metadata(fleet_secret)  # shown on every RankRegistry call
        self._registration = router_pb2.RegisterRequest(
            rank_id=rank_id,
            address=advertise_address,
            max_batch_size=max_batch_size,
            role=ROLES[role],
            block_size=block_size,
        )
        self._load = load
        self._draining = draining  # read at each heartbeat: the operator's scale-in mark
        self._leaving = leaving  # read at each heartbeat: the rank is shutting down
        # Set once a router took a heartbeat that said the rank is leaving.
        self.leaving_heard = threading.Event()
        self._wake = threading.Event()  # heartbeat now (see `beat_now`)
        self._dial_lock = threading.Lock()  # the heartbeat thread redials; both threads call
        self._dialed = 0  # index into _addresses
        self._channel = grpc.insecure_channel(self._addresses[0])
        self._registry = router_pb2_grpc.RankRegistryStub(self._channel)
        self._events: queue.Queue[list[BlockEvent] | None] = queue.Queue()
        self._stop = threading.Event()
        self.registered = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rpc_timeout = RPC_TIMEOUT_SECONDS  # shortened to the interval at registration

    def start(self) -> RouterLink:
        """Start the heartbeat and KV event threads."""
        for target, name in ((self._beat, "heartbeat"), (self._publish, "kv-events")):
            thread = threading.Thread(target=target, name=f"{name}-{self.rank_id}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def publish(self, events: list[BlockEvent]) -> None:
        """Queue events for the router (called on the engine core thread; never blocks)."""
        self._events.put(events)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads and close the channel."""
        self._stop.set()
        self._wake.set()
        self._events.put(None)
        for thread in self._threads:
            thread.join(timeout)
        with self._dial_lock:
            self._channel.close()

    def beat_now(self) -> None:
        """Send the next heartbeat now rather than at its interval (a change to report)."""
        self._wake.set()

    @property
    def router_address(self) -> str:
        """The router address the link talks to now."""
        with self._dial_lock:
            return self._addresses[self._dialed]

    def _stub(self) -> router_pb2_grpc.RankRegistryStub:
        with self._dial_lock:
            return self._registry

    def _redial(self) -> None:
        """Drop the connection (its calls end) and dial the next address; register there."""
        self.registered.clear()
        with self._dial_lock:
            self._channel.close()
            self._dialed = (self._dialed + 1) % len(self._addresses)
            self._channel = grpc.insecure_channel(self._addresses[self._dialed])
            self._registry = router_pb2_grpc.RankRegistryStub(self._channel)
            address = self._addresses[self._dialed]
        log.warning("rank %s: dialling router %s", self.rank_id, address)

    def _register(self) -> float:
        reply = self._stub().Register(
            self._registration, timeout=self._rpc_timeout, metadata=self._metadata
        )
        self.registered.set()
        log.info("rank %s registered", self.rank_id)
        interval = reply.heartbeat_interval_seconds or 1.0
        self._rpc_timeout = min(RPC_TIMEOUT_SECONDS, interval)
        return interval

    def _beat(self) -> None:
        interval = RETRY_SECONDS
        failures = 0  # in a row: every address tried once, wait before the next round
        while not self._stop.is_set():
            try:
                if not self.registered.is_set():
                    interval = self._register()
                self._wake.clear()  # before the read: a later change wakes the next beat
                load = self._load()
                leaving = self._leaving()
                reply = self._stub().Heartbeat(
                    router_pb2.HeartbeatRequest(
                        rank_id=self.rank_id,
                        load=router_pb2.RankLoad(
                            free_slots=load.free_slots,
                            queued=load.queued,
                            kv_usage=load.kv_usage,
                            draining=self._draining(),
                            leaving=leaving,
                        ),
                    ),
                    timeout=self._rpc_timeout,
                    metadata=self._metadata,
                )
                failures = 0
                if not reply.registered:
                    self.registered.clear()
                    continue
                if leaving:
                    self.leaving_heard.set()
            except grpc.RpcError as error:
                log.warning(
                    "rank %s: router refused or unreachable (%s %s)",
                    self.rank_id,
                    error.code().name,
                    error.details(),
                )
                if self._stop.is_set():
                    return
                self._redial()
                failures += 1
                if failures % len(self._addresses) == 0:
                    self._stop.wait(RETRY_SECONDS)
                continue
            self._wake.wait(interval)

    def _batches(self, call_ended: threading.Event) -> Iterator[router_pb2.KvEventBatch]:
        # grpc reads this on a thread of its own that outlives a broken call: without the
        # checks, every broken stream would leave one thread blocked on the queue for good.
        while not (call_ended.is_set() or self._stop.is_set()):
            try:
                events = self._events.get(timeout=QUEUE_POLL_SECONDS)
            except queue.Empty:
                continue
            if events is None:
                return
            yield from split_batches(self.rank_id, [event_proto(e) for e in events])

    def _publish(self) -> None:
        # NOTE: events lost while the router is away are not replayed; the router forgets a
        # silent rank's blocks anyway, and new commits re-teach it.
        while not self._stop.is_set():
            if not self.registered.wait(RETRY_SECONDS):
                continue
            call_ended = threading.Event()
            try:
                self._stub().PublishKvEvents(self._batches(call_ended), metadata=self._metadata)
                return
            except grpc.RpcError as error:
                log.warning("rank %s: KV event stream broke (%s)", self.rank_id, error.code().name)
                self._stop.wait(RETRY_SECONDS)
            finally:
                call_ended.set()


def split_batches(
    rank_id: str, events: list[router_pb2.KvEvent], most_bytes: int = KV_BATCH_BYTES
) -> Iterator[router_pb2.KvEventBatch]:
    """The events in batches of at most `most_bytes` (one larger event goes alone): the router
    caps a batch at what this cut needs (fleet_secret.py)."""
    batch: list[router_pb2.KvEvent] = []
    size = 0
    for event in events:
        event_bytes = event.ByteSize() + 8  # field tag and length prefix
        if batch and size + event_bytes > most_bytes:
            yield router_pb2.KvEventBatch(rank_id=rank_id, events=batch)
            batch, size = [], 0
        batch.append(event)
        size += event_bytes
    if batch:
        yield router_pb2.KvEventBatch(rank_id=rank_id, events=batch)
