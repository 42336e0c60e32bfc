"""The client-facing gRPC servicer (Router.Generate): a thin translation onto the runtime.

The rank-facing one (RankRegistry) is in registry_service.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import grpc

from ...proto import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from ...proto.limits import GRPC_MESSAGE_OPTIONS
from .attempt_ids import attempt_id
from .deadlines import call_timeout
from .errors import DuplicateRequest, RankUnavailable, RouterError, grpc_code
from .handoff import HandoffForwarder, as_first_token, is_handoff
from .model import Admission, PendingRequest
from .prefetch import PrefetchPlanner
from .prefix_index import prompt_root
from .retry_loop import RetryLoop, RetryRules, TruncatedStream
from .runtime import RouterRuntime
from .stream_watch import StreamWatch, watched_chunks
from .validation import RequestLimits, validate

MAX_ATTEMPTS = 3


# Each channel keeps its own connections: gRPC otherwise shares them between channels to one
# address, and a renewed channel would inherit the dead connection's reconnect backoff.
ENGINE_CHANNEL_OPTIONS = (*GRPC_MESSAGE_OPTIONS, ("grpc.use_local_subchannel_pool", 1))


class EngineChannels:
    """One gRPC channel per engine address, reused by every forwarded request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stubs: dict[str, engine_pb2_grpc.EngineStub] = {}
        self._channels: list[grpc.Channel] = []

    def stub(self, address: str) -> engine_pb2_grpc.EngineStub:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address, options=ENGINE_CHANNEL_OPTIONS)
                self._channels.append(channel)
                self._stubs[address] = engine_pb2_grpc.EngineStub(channel)
            return self._stubs[address]

    def renew(self, address: str) -> None:
        """A fresh channel for the next call to `address` (a rank that started again there).

        The old channel saw the rank die and waits out gRPC's reconnect backoff, failing every
        call with "connection refused" meanwhile: the restarted rank would be removed again
        seconds after it registered. The old channel is not closed here (a stream of the old
        process may still end on it); `close` ends it with the others.
        """
        with self._lock:
            self._stubs.pop(address, None)

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
        watch: StreamWatch,
        max_call_seconds: float | None = None,
        prefetch: PrefetchPlanner | None = None,
        migrate_kv: bool = False,
    ) -> None:
        self._runtime = runtime
        # A turn placed away from its live home tells its new rank where the KV is.
        self._migrate_kv = migrate_kv
        self._prefetch = prefetch
        self._watch = watch
        self._channels = channels
        self._limits = limits
        self._clock = clock
        self._max_call_seconds = max_call_seconds
        self._in_flight: set[str] = set()
        self._in_flight_lock = threading.Lock()
        self._retries = RetryLoop(runtime, clock, RetryRules("rank", MAX_ATTEMPTS))
        self._handoff = HandoffForwarder(
            runtime, channels, clock, self._wait_for_admission, self._call_timeout, self._watch
        )

    def _call_timeout(self, context) -> float | None:
        return call_timeout(context, self._max_call_seconds)

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
        if self._prefetch is not None:
            self._prefetch.turn_arrived(request.conversation_id)
        try:
            last = arrived
            for sent, response in enumerate(self._serve(request, request_id, context)):
                now = self._clock()
                if sent == 0:
                    self._runtime.metrics.observe_ttft(now - arrived)
                else:
                    self._runtime.metrics.inter_chunk.observe(now - last)
                last = now
                yield response
        except RouterError as error:
            self._abort(context, error)
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(request_id)

    def _serve(self, request, request_id: str, context) -> Iterator[router_pb2.GenerateResponse]:
        relax = request.relax_rank
        explicit = [request.rank_id] if request.HasField("rank_id") else []
        handoff: list[common_pb2.GenerationChunk] = []

        def admit() -> Admission | None:
            pending = self._pending(request, request_id, explicit[0] if explicit else None, relax)
            return self._wait_for_admission(pending, context)

        # The engine's id of each placement: a retry gets its own, as the rank an abandoned
        # stream left may still hold the attempt before (its cancel still on the way there).
        engine_ids: list[str] = []

        def forward(admission: Admission, first: bool) -> Iterator[router_pb2.GenerateResponse]:
            engine_ids.append(attempt_id(request_id, len(engine_ids)))
            return self._forward(
                request, request_id, engine_ids[-1], admission, context, first, handoff
            )

        def lost_before_output(reason: str) -> None:
            if explicit and not relax:
                raise RankUnavailable(f"rank {explicit[0]} failed: {reason}")
            explicit.clear()  # a relaxed explicit rank is placed by load from now on

        admission = yield from self._retries.run(
            request_id, context, admit, forward, lost_before_output
        )
        if admission is None:
            return  # the client went away
        if handoff:  # the context slot is given back already; now the generation half
            # the context rank parked the turn under its attempt's id
            yield from self._handoff.run(
                request, request_id, engine_ids[-1], admission, handoff[0], context
            )
        elif self._prefetch is not None:
            self._prefetch.turn_ended(request.conversation_id, admission.rank.address)

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
            prefix_root=prompt_root(request.cache_salt),
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
        engine_id: str,
        admission: Admission,
        context,
        first: bool,
        handoff: list[common_pb2.GenerationChunk],
    ) -> Iterator[router_pb2.GenerateResponse]:
        """Stream the rank's chunks (as `request_id`'s; the rank knows the attempt as
        `engine_id`); a context rank's hand-off chunk is kept in `handoff`."""
        engine_request = engine_pb2.EngineGenerateRequest(
            request_id=engine_id,
            conversation_id=request.conversation_id,
            sampling=request.sampling,
            max_tokens=request.max_tokens,
            num_samples=admission.request.slots,
            cache_salt=request.cache_salt,
            branch_hints=request.branch_hints,
            retention_seconds=request.retention_seconds,
        )
        if request.HasField("prompt_token_ids"):
            engine_request.prompt_token_ids.CopyFrom(request.prompt_token_ids)
        else:
            engine_request.prompt_text = request.prompt_text
        if self._migrate_kv and admission.home is not None and request.conversation_id:
            engine_request.kv_home_address = admission.home.address
            self._runtime.metrics.kv_moves.inc()
        stub = self._channels.stub(admission.rank.address)
        call = stub.Generate(engine_request, timeout=self._call_timeout(context))
        context.add_callback(call.cancel)
        rank_id = admission.rank.rank_id
        finished = 0
        for chunk in watched_chunks(self._watch, rank_id, call):
            placement = admission.placement.value if first else ""
            first = False
            finished += chunk.finished
            if is_handoff(chunk):
                handoff.append(chunk)
                chunk = as_first_token(chunk)
            chunk.request_id = request_id
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
