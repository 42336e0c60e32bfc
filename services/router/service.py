"""The gRPC servicers: thin translations between protos and the router runtime."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial

import grpc
from kvfleet.proto import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.services.router.errors import (
    DuplicateRequest,
    EngineRejected,
    RankUnavailable,
    RouterError,
    grpc_code,
)
from kvfleet.services.router.handoff import HandoffForwarder, as_first_token, is_handoff
from kvfleet.services.router.model import Admission, PendingRequest, RankInfo, RankLoad, Role
from kvfleet.services.router.runtime import RouterRuntime
from kvfleet.services.router.validation import RequestLimits, validate

log = logging.getLogger(__name__)

ROLES = {
    common_pb2.RANK_ROLE_UNSPECIFIED: Role.BOTH,
    common_pb2.RANK_ROLE_BOTH: Role.BOTH,
    common_pb2.RANK_ROLE_CONTEXT: Role.CONTEXT,
    common_pb2.RANK_ROLE_GENERATION: Role.GENERATION,
}
# Engine errors that mean the rank itself is gone, not that the request was bad.
RANK_FAILURE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
MAX_ATTEMPTS = 3


class TruncatedStream(Exception):
    """An engine closed the stream before every sample finished."""


class EngineChannels:
    """One gRPC channel per engine address, reused by every forwarded request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stubs: dict[str, engine_pb2_grpc.EngineStub] = {}
        self._channels: list[grpc.Channel] = []

    def stub(self, address: str) -> engine_pb2_grpc.EngineStub:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address)
                self._channels.append(channel)
                self._stubs[address] = engine_pb2_grpc.EngineStub(channel)
            return self._stubs[address]

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()


class RouterServicer(router_pb2_grpc.RouterServicer):
    """Client-facing Generate: validate, queue, wait for admission, forward, stream back."""

    def __init__(
        self,
        runtime: RouterRuntime,
        channels: EngineChannels,
        limits: RequestLimits,
        clock: Callable[[], float],
    ) -> None:
        self._runtime = runtime
        self._channels = channels
        self._limits = limits
        self._clock = clock
        self._in_flight: set[str] = set()
        self._in_flight_lock = threading.Lock()
        self._handoff = HandoffForwarder(runtime, channels, clock, self._wait_for_admission)

    def Generate(self, request, context) -> Iterator[router_pb2.GenerateResponse]:
        request_id = request.request_id or uuid.uuid4().hex
        try:
            validate(request, self._limits, self._runtime.ranks())
            with self._in_flight_lock:
                if request_id in self._in_flight:
                    raise DuplicateRequest(f"request_id: {request_id!r} is already in flight")
                self._in_flight.add(request_id)
        except RouterError as error:
            self._abort(context, error)
        arrived = self._clock()
        try:
            for sent, response in enumerate(self._serve(request, request_id, context)):
                if sent == 0:
                    self._runtime.metrics.observe_ttft(self._clock() - arrived)
                yield response
        except RouterError as error:
            self._abort(context, error)
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(request_id)

    def _serve(self, request, request_id: str, context) -> Iterator[router_pb2.GenerateResponse]:
        relax = request.relax_rank
        explicit = request.rank_id if request.HasField("rank_id") else None
        sent = 0
        handoff: list[common_pb2.GenerationChunk] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            admission = self._wait_for_admission(
                self._pending(request, request_id, explicit, relax), context
            )
            if admission is None:
                return  # client went away while queued
            try:
                for response in self._forward(
                    request, request_id, admission, context, sent == 0, handoff
                ):
                    sent += 1
                    yield response
                if handoff:
                    break  # the context slot is given back first (finally), then generation
                return
            except grpc.RpcError as error:
                if error.code() not in RANK_FAILURE_CODES or not context.is_active():
                    raise EngineRejected(
                        error.code(), f"rank {admission.rank.rank_id}: {error.details()}"
                    ) from error
                self._runtime.rank_failed(admission.rank.rank_id, error.details() or "")
                reason = f"{error.code().name} {error.details()}"
            except TruncatedStream as error:
                reason = str(error)
                self._runtime.rank_failed(admission.rank.rank_id, reason)
            finally:
                self._runtime.finish(admission)
            if sent:
                raise RankUnavailable(
                    f"rank {admission.rank.rank_id} failed after {sent} chunks were sent "
                    f"({reason}); retry the request"
                )
            if explicit is not None and not relax:
                raise RankUnavailable(f"rank {explicit} failed: {reason}")
            explicit = None
            self._runtime.metrics.retries.inc()
            log.warning(
                "request %s: rank %s failed before output (%s), attempt %d of %d",
                request_id,
                admission.rank.rank_id,
                reason,
                attempt,
                MAX_ATTEMPTS,
            )
        else:
            raise RankUnavailable(f"{MAX_ATTEMPTS} ranks failed before producing output")
        yield from self._handoff.run(request, request_id, admission, handoff[0], context)

    def _pending(
        self, request, request_id: str, explicit: str | None, relax: bool
    ) -> PendingRequest:
        tokens = tuple(request.prompt_token_ids.ids) if request.HasField("prompt_token_ids") else ()
        return PendingRequest(
            request_id=request_id,
            conversation_id=request.conversation_id,
            enqueued_at=self._clock(),
            child_samples=request.child_samples,
            explicit_rank=explicit,
            relax_rank=relax,
            prompt_tokens=tokens,
        )

    def _wait_for_admission(
        self, pending: PendingRequest, context, pool: str = "context"
    ) -> Admission | None:
        ticket = self._runtime.submit(pending, pool)
        context.add_callback(lambda: self._runtime.cancel(ticket))
        while not ticket.wait(0.25):
            if not context.is_active():
                self._runtime.cancel(ticket)
                if not ticket.done.is_set():
                    return None
        if ticket.error is not None:
            raise ticket.error
        return ticket.admission

    def _forward(
        self,
        request,
        request_id: str,
        admission: Admission,
        context,
        first: bool,
        handoff: list[common_pb2.GenerationChunk],
    ) -> Iterator[router_pb2.GenerateResponse]:
        """Stream the rank's chunks; a context rank's hand-off chunk is kept in `handoff`."""
        engine_request = engine_pb2.EngineGenerateRequest(
            request_id=request_id,
            conversation_id=request.conversation_id,
            sampling=request.sampling,
            max_tokens=request.max_tokens,
            num_samples=admission.request.slots,
        )
        if request.HasField("prompt_token_ids"):
            engine_request.prompt_token_ids.CopyFrom(request.prompt_token_ids)
        else:
            engine_request.prompt_text = request.prompt_text
        stub = self._channels.stub(admission.rank.address)
        timeout = context.time_remaining()
        call = stub.Generate(engine_request, timeout=timeout)
        context.add_callback(call.cancel)
        rank_id = admission.rank.rank_id
        finished = 0
        for chunk in call:
            placement = admission.placement.value if first else ""
            first = False
            finished += chunk.finished
            if is_handoff(chunk):
                handoff.append(chunk)
                chunk = as_first_token(chunk)
            yield router_pb2.GenerateResponse(chunk=chunk, rank_id=rank_id, placement=placement)
        if finished < admission.request.slots:
            raise TruncatedStream(
                f"rank {rank_id} ended the stream with {finished} of "
                f"{admission.request.slots} samples finished"
            )

    def _abort(self, context, error: RouterError) -> None:
        code = grpc_code(error)
        self._runtime.metrics.failed.labels(code.name).inc()
        context.abort(code, str(error))


class RankRegistryServicer(router_pb2_grpc.RankRegistryServicer):
    """Engine-facing registry: register, heartbeat, KV events."""

    def __init__(self, runtime: RouterRuntime, heartbeat_interval_seconds: float) -> None:
        self._runtime = runtime
        self._interval = heartbeat_interval_seconds

    def Register(self, request, context) -> router_pb2.RegisterResponse:
        try:
            info = RankInfo(
                rank_id=request.rank_id,
                address=request.address,
                max_batch_size=request.max_batch_size,
                role=ROLES.get(request.role, Role.BOTH),
                block_size=request.block_size or 16,
            )
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if not request.address:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "address: empty")
        self._runtime.register(info)
        log.info(
            "rank %s registered at %s with %d slots",
            info.rank_id,
            info.address,
            info.max_batch_size,
        )
        return router_pb2.RegisterResponse(heartbeat_interval_seconds=self._interval)

    def Heartbeat(self, request, context) -> router_pb2.HeartbeatResponse:
        reported = request.load
        load = RankLoad(reported.free_slots, reported.queued, reported.kv_usage, reported.draining)
        return router_pb2.HeartbeatResponse(
            registered=self._runtime.heartbeat(request.rank_id, load)
        )

    def PublishKvEvents(self, request_iterator, context) -> router_pb2.KvEventsAck:
        applied = 0
        for batch in request_iterator:
            rank = self._runtime.ranks().get(batch.rank_id)
            if rank is None:
                return context.abort(  # raises: the stream ends here
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"rank_id: {batch.rank_id!r} is not registered",
                )
            events = list(batch.events)
            try:
                self._runtime.with_prefix_index(
                    partial(
                        _apply_events,
                        rank_id=batch.rank_id,
                        events=events,
                        block_size=rank.info.block_size,
                    )
                )
            except ValueError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"events: {error}")
            applied += len(events)
        return router_pb2.KvEventsAck(events_applied=applied)


def _apply_events(index, rank_id: str, events, block_size: int) -> None:
    for event in events:
        _apply_event(index, rank_id, event, block_size)


def _apply_event(index, rank_id: str, event, block_size: int) -> None:
    kind = event.WhichOneof("event")
    if kind == "stored":
        stored = event.stored
        parent = stored.parent_block_hash if stored.HasField("parent_block_hash") else None
        index.stored(rank_id, list(stored.block_hashes), parent, list(stored.token_ids), block_size)
    elif kind == "removed":
        index.removed(rank_id, list(event.removed.block_hashes))
    elif kind == "cleared":
        index.clear(rank_id)
