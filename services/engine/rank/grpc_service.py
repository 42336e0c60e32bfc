"""The engine's gRPC service (proto/engine.proto): a thin translation onto the engine core."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ....proto import common_pb2, engine_pb2, engine_pb2_grpc
from ....proto.pooled_server import PooledServer
from ...disagg.context_side import HeldPrefixMismatch, HoldNotFound
from ...disagg.generation_side import HandoffFailed, HandoffNoRoom
from ...disagg.grpc_pull import serve_pull
from ...disagg.prefix_export import check_pull, export_prefix
from ..core.detokenizer import StopChecker, StreamDetokenizer
from ..core.engine_core import EngineCore
from ..core.grammar_compiler import GrammarCompiler, compile_grammar
from ..core.request_handle import RequestCancelled
from ..model.tokenizer import Tokenizer
from ..request.engine_request import (
    EngineStoppedError,
    GenerateCall,
    InvalidRequestError,
    SampleOutput,
    SequenceFailedError,
)
from ..request.request_inputs import branch_hints_of, make_sampling, retention_seconds_of

log = logging.getLogger(__name__)

SERVICE_NAME = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name
OUTPUT_TIMEOUT_SECONDS = 600.0
MAX_SALT_CHARS = 256

# The one map from engine errors to gRPC status codes.
GRPC_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    EngineStoppedError: grpc.StatusCode.UNAVAILABLE,
    # One request failed inside a step: INTERNAL, never UNAVAILABLE (the rank is fine).
    SequenceFailedError: grpc.StatusCode.INTERNAL,
    TimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    # KV hand-off: ABORTED, not UNAVAILABLE, so the router does not take this rank for dead.
    HandoffFailed: grpc.StatusCode.ABORTED,
    HandoffNoRoom: grpc.StatusCode.RESOURCE_EXHAUSTED,
    HoldNotFound: grpc.StatusCode.NOT_FOUND,
    HeldPrefixMismatch: grpc.StatusCode.FAILED_PRECONDITION,
}
HANDOFF_ERRORS = (HandoffFailed, HandoffNoRoom, InvalidRequestError, ValueError)


def call_from_proto(
    request: engine_pb2.EngineGenerateRequest,
    tokenizer: Tokenizer,
    request_id: str,
    grammars: GrammarCompiler | None = None,
) -> GenerateCall:
    """A GenerateCall from an EngineGenerateRequest; InvalidRequestError names the field."""
    kind = request.WhichOneof("prompt")
    if kind == "prompt_token_ids":
        prompt = tuple(request.prompt_token_ids.ids)
    elif kind == "prompt_text":
        prompt = tuple(tokenizer.encode(request.prompt_text))
    else:
        raise InvalidRequestError("prompt", "empty: set prompt_token_ids or prompt_text")
    sampling = request.sampling
    top_p = sampling.top_p if sampling.top_p > 0 else 1.0  # proto: 0 = no nucleus cut
    params = make_sampling(
        temperature=sampling.temperature,
        top_p=top_p,
        seed=sampling.seed if sampling.HasField("seed") else None,
        max_tokens=request.max_tokens,
        stop_token_ids=tuple(sampling.stop_token_ids),
        prefix="sampling.",
        stop=tuple(sampling.stop),
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty or None,  # proto: 0 = none
        logprobs=sampling.logprobs if sampling.HasField("logprobs") else None,
        grammar=sampling.grammar,
    )
    if len(request.cache_salt) > MAX_SALT_CHARS:
        raise InvalidRequestError(
            "cache_salt", f"{len(request.cache_salt)} chars > {MAX_SALT_CHARS}"
        )
    return GenerateCall(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=params,
        conversation_id=request.conversation_id or None,
        num_samples=max(1, request.num_samples),
        stop_check=StopChecker(tokenizer, params.stop).hit if params.stop else None,
        cache_salt=request.cache_salt,
        branch_hints=branch_hints_of(request.branch_hints, len(prompt)),
        grammar=compile_grammar(grammars or GrammarCompiler(tokenizer), params),
        retention_seconds=retention_seconds_of(request.retention_seconds),
    )


def chunk_from_output(output: SampleOutput, text: str) -> common_pb2.GenerationChunk:
    """The proto chunk of one engine output (usage only on a sample's last chunk)."""
    chunk = common_pb2.GenerationChunk(
        request_id=output.request_id,
        sample_index=output.sample_index,
        token_ids=list(output.token_ids),
        text=text,
        finished=output.finished,
        finish_reason=output.finish_reason,
    )
    for item in output.logprobs:
        top_ids, top_values = zip(*item.top, strict=True) if item.top else ((), ())
        chunk.logprobs.add(
            token_id=item.token,
            logprob=item.logprob,
            top_token_ids=top_ids,
            top_logprobs=top_values,
        )
    if output.usage is not None:
        usage = output.usage
        chunk.usage.CopyFrom(
            common_pb2.Usage(
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                ttft_seconds=usage.ttft_seconds,
            )
        )
    return chunk


class SequenceSlots:
    """Sequences running through Generate calls: never more than the rank's max_batch_size,
    whatever the routers believe (replicas without Redis, or a lapsed reservation)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> bool:
        with self._lock:
            if self.running + count > self.capacity:
                return False
            self.running += count
            self.peak = max(self.peak, self.running)
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self.running -= count


class CallsInFlight:
    """How many calls are inside a `with` block now (`running`)."""

    def __init__(self) -> None:
        self.running = 0
        self._lock = threading.Lock()

    def __enter__(self) -> CallsInFlight:
        with self._lock:
            self.running += 1
        return self

    def __exit__(self, *_) -> None:
        with self._lock:
            self.running -= 1


class EngineServicer(engine_pb2_grpc.EngineServicer):
    """Generate streams the core's outputs; a cancelled call cancels the request. A call that
    would run more than max_batch_size sequences is refused with RESOURCE_EXHAUSTED (the
    router queues it again).

    A leaving rank (`leave`) refuses new generation work (Generate, PrefetchConversation) with
    UNAVAILABLE, as a stopped server would (the router keeps a leaving rank and retries the
    call elsewhere), but serves PullKvBlocks until it stops: a conversation moved off it pulls
    its blocks from here while the rank lives."""

    def __init__(self, core: EngineCore, tokenizer: Tokenizer) -> None:
        self._core = core
        self._tokenizer = tokenizer
        self._grammars = GrammarCompiler(tokenizer)
        self.slots = SequenceSlots(core.config.max_batch_size)
        self.leaving = threading.Event()
        self.streams = CallsInFlight()  # Generate calls

    def leave(self) -> None:
        """Refuse new generation work from now on; pulls are still served."""
        self.leaving.set()

    def _refuse_if_leaving(self, context) -> None:
        if self.leaving.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "rank is leaving: it takes no new work")

    def Generate(self, request, context) -> Iterator[common_pb2.GenerationChunk]:
        # NOTE: counted before the check, so a drain that saw no stream after `leave` sees
        # every stream that got past it.
        with self.streams:
            self._refuse_if_leaving(context)
            yield from self._slotted(request, context)

    def _slotted(self, request, context) -> Iterator[common_pb2.GenerationChunk]:
        count = max(1, request.num_samples)
        if not self.slots.take(count):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"num_samples: {count} more sequences do not fit: {self.slots.running} of "
                f"max_batch_size {self.slots.capacity} running",
            )
        once = threading.Lock()

        def give_back() -> None:
            if once.acquire(blocking=False):
                self.slots.give(count)

        context.add_callback(give_back)
        try:
            yield from self._generate(request, context, give_back)
        finally:
            give_back()

    def _generate(self, request, context, done) -> Iterator[common_pb2.GenerationChunk]:
        """The call's chunks; `done()` runs before the last one is sent, so a router that
        admits the next request on that slot at once finds it free."""
        request_id = request.request_id or self._core.next_request_id()
        try:
            call = call_from_proto(request, self._tokenizer, request_id, self._grammars)
            if request.kv_source_address or request.handoff_token_ids:
                if request.kv_home_address:
                    raise ValueError("kv_home_address: a hand-off's KV comes from its source")
                handle = self._core.role.receiver().receive(
                    call,
                    request.kv_source_address,
                    tuple(request.handoff_token_ids),
                    request.kv_source_request_id,
                )
            else:
                if request.kv_home_address:  # a moved turn: its home's prefix first
                    self._core.validate(call)
                    self._core.role.prefix_pull.pull(call, request.kv_home_address)
                handle = self._core.submit(call)
        except HANDOFF_ERRORS as error:
            code = GRPC_CODES.get(type(error), grpc.StatusCode.INVALID_ARGUMENT)
            context.abort(code, str(error))
        context.add_callback(handle.cancel)
        detokenizer = StreamDetokenizer(self._tokenizer)
        unfinished = call.num_samples
        try:
            for output in handle.outputs(OUTPUT_TIMEOUT_SECONDS):
                text = detokenizer.piece(output.sample_index, output.token_ids, output.finished)
                unfinished -= output.finished
                if not unfinished:
                    done()
                yield chunk_from_output(output, text)
        except RequestCancelled:
            return  # the caller cancelled the call: nobody reads this stream
        except (
            EngineStoppedError,
            SequenceFailedError,
            TimeoutError,
            InvalidRequestError,
        ) as error:
            handle.cancel()
            context.abort(self._code_of(error), str(error))

    def _code_of(self, error: Exception) -> grpc.StatusCode:
        # NOTE: UNAVAILABLE makes the router remove this rank, so it is kept for a rank that
        # is going away; a running core that failed this request answers INTERNAL.
        if isinstance(error, EngineStoppedError) and not self._core.stopping:
            return grpc.StatusCode.INTERNAL
        return GRPC_CODES[type(error)]

    def PrefetchConversation(self, request, context) -> engine_pb2.PrefetchReply:
        self._refuse_if_leaving(context)
        prompt = tuple(request.prompt_token_ids.ids)
        try:
            result = self._core.prefetch_conversation(
                request.conversation_id, request.hold_seconds, prompt
            )
        except (InvalidRequestError, EngineStoppedError, TimeoutError) as error:
            context.abort(self._code_of(error), str(error))
        return engine_pb2.PrefetchReply(
            held=result.held, host_blocks=result.host_blocks, disk_blocks=result.disk_blocks
        )

    def PullKvBlocks(self, request, context):
        if request.HasField("prompt_token_ids"):  # a moved turn's prefix, on any role
            yield from self._pull_prefix(request, context)
            return
        side = getattr(self._core.role, "side", None)
        if side is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"PullKvBlocks: rank role {self._core.config.role!r} parks no KV",
            )
        life_cycles = tuple(self._core.manager.life_cycles)

        def export(request_id: str, held: tuple[int, ...]):
            return self._core.call_on_core(lambda: side.export(request_id, held))

        try:
            yield from serve_pull(export, life_cycles, request, context)
        except (HoldNotFound, HeldPrefixMismatch) as error:
            context.abort(GRPC_CODES[type(error)], str(error))

    def _pull_prefix(self, request, context):
        core, prompt = self._core, tuple(request.prompt_token_ids.ids)
        held = tuple(request.block_hashes)
        try:
            check_pull(prompt, request.cache_salt, core.max_request_tokens())
            blocks = core.call_on_core(
                lambda: export_prefix(core, prompt, request.cache_salt, held)
            )
        except (ValueError, EngineStoppedError, TimeoutError) as error:
            context.abort(GRPC_CODES.get(type(error), grpc.StatusCode.INVALID_ARGUMENT), str(error))
        yield from serve_pull(lambda *_: blocks, tuple(core.manager.life_cycles), request, context)


def server_workers(max_batch_size: int) -> int:
    """Threads of a rank's gRPC pool: a Generate stream holds one for its whole life, so
    every slot gets one, with as many again for the queue the router keeps at the rank, and
    some for prefetch, pulls and health (a fixed 64 capped a batch of 256 at 64 running)."""
    return 2 * max_batch_size + 32


def create_engine_server(
    address: str, core: EngineCore, tokenizer: Tokenizer, max_workers: int | None = None
) -> tuple[grpc.Server, health.HealthServicer, int, EngineServicer]:
    """Serve Engine + health on `address` (port 0 picks one); returns server, health, port and
    the Engine servicer."""
    workers = max_workers or server_workers(core.config.max_batch_size)
    server = PooledServer(workers, "engine-grpc")
    servicer = EngineServicer(core, tokenizer)
    engine_pb2_grpc.add_EngineServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the engine to {address}")
    server.start()
    return server, health_servicer, port, servicer
