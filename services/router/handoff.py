"""The second placement of a disaggregated turn: from a context rank to a generation rank.

A context rank answers a turn with one chunk whose `finish_reason` is `handoff`: it prefilled,
sampled the first token and parked the KV. The router streams that token on (as unfinished),
gives the context slot back, queues the turn for the generation pool (strict affinity there
too, pinned under `<conversation>@generation`), and forwards it with the context rank's address
so the generation rank pulls the KV and decodes from the next token.

| what fails                               | what the client gets                              |
|------------------------------------------|---------------------------------------------------|
| generation rank unreachable, or its      | the turn is placed on another generation rank     |
| stream ended, before output              |                                                   |
| every generation rank full               | queued again until the router's queue limit or    |
|                                          | MAX_FULL_REQUEUES: RESOURCE_EXHAUSTED             |
| generation rank lost mid-decode           | UNAVAILABLE naming the rank and the chunks sent   |
| KV gone (context lost, hold expired) and  | ABORTED from the generation rank, naming each     |
| no disk copy                              | transport's failure                               |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ...proto import common_pb2, engine_pb2, router_pb2
from .attempt_ids import attempt_id
from .model import Admission, PendingRequest
from .retry_loop import RetryLoop, RetryRules, TruncatedStream
from .stream_watch import watched_chunks

HANDOFF_REASON = "handoff"
GENERATION_PIN_SUFFIX = "@generation"
MAX_GENERATION_ATTEMPTS = 3
# The held KV of the context rank expires; a turn no generation rank takes soon enough fails
# (before the router's queue limit, when that is longer).
MAX_FULL_REQUEUES = 20
GENERATION_RETRIES = RetryRules("generation rank", MAX_GENERATION_ATTEMPTS, MAX_FULL_REQUEUES)


def is_handoff(chunk: common_pb2.GenerationChunk) -> bool:
    """True for the context rank's last chunk of a turn it hands off."""
    return chunk.finished and chunk.finish_reason == HANDOFF_REASON


def as_first_token(chunk: common_pb2.GenerationChunk) -> common_pb2.GenerationChunk:
    """The hand-off chunk as the client sees it: the first token, not finished, no usage."""
    shown = common_pb2.GenerationChunk()
    shown.CopyFrom(chunk)
    shown.finished = False
    shown.finish_reason = ""
    shown.ClearField("usage")
    return shown


def generation_request(
    request, request_id: str, conversation_id: str, clock: Callable[[], float]
) -> PendingRequest:
    """The turn as the generation pool's queue sees it (its own id and pin key)."""
    tokens = tuple(request.prompt_token_ids.ids) if request.HasField("prompt_token_ids") else ()
    return PendingRequest(
        request_id=f"{request_id}{GENERATION_PIN_SUFFIX}",
        conversation_id=f"{conversation_id}{GENERATION_PIN_SUFFIX}" if conversation_id else "",
        enqueued_at=clock(),
        prompt_tokens=tokens,
    )


class HandoffForwarder:
    """Runs the generation half of a turn; the router servicer calls it after a hand-off."""

    def __init__(
        self,
        runtime,
        channels,
        clock: Callable[[], float],
        wait_for_admission,
        call_timeout,
        watch,
    ) -> None:
        self._watch = watch
        self._call_timeout = call_timeout  # context -> timeout of a forwarded call (None: none)
        self._runtime = runtime
        self._channels = channels
        self._clock = clock
        self._wait_for_admission = wait_for_admission
        self._retries = RetryLoop(runtime, clock, GENERATION_RETRIES)

    def run(
        self,
        request,
        request_id: str,
        source_id: str,
        context_admission: Admission,
        handoff: common_pb2.GenerationChunk,
        context,
    ) -> Iterator[router_pb2.GenerateResponse]:
        """Place the turn on a generation rank and stream its tokens after the first; the
        context rank parked its KV as `source_id` (the context half's last attempt)."""

        def admit() -> Admission | None:
            pending = generation_request(request, request_id, request.conversation_id, self._clock)
            return self._wait_for_admission(pending, context, "generation")

        engine_ids: list[str] = []  # as in the context half: a retry never meets its attempt

        def forward(admission: Admission, first: bool) -> Iterator[router_pb2.GenerateResponse]:
            engine_ids.append(attempt_id(request_id, len(engine_ids)))
            return self._forward(
                request,
                (request_id, engine_ids[-1], source_id),
                admission,
                context_admission,
                handoff,
                context,
                first,
            )

        yield from self._retries.run(request_id, context, admit, forward)

    def _forward(
        self, request, ids, admission, context_admission, handoff, context, first: bool
    ) -> Iterator[router_pb2.GenerateResponse]:
        """Stream the generation rank's chunks; `ids`: the turn's, this attempt's, and the one
        the context rank parked the KV under."""
        request_id, engine_id, source_id = ids
        engine_request = engine_pb2.EngineGenerateRequest(
            request_id=engine_id,
            conversation_id=request.conversation_id,
            sampling=request.sampling,
            max_tokens=request.max_tokens,
            num_samples=1,
            kv_source_address=context_admission.rank.address,
            kv_source_request_id=source_id,
            handoff_token_ids=list(handoff.token_ids),
            cache_salt=request.cache_salt,
            branch_hints=request.branch_hints,
            retention_seconds=request.retention_seconds,
        )
        if request.HasField("prompt_token_ids"):
            engine_request.prompt_token_ids.CopyFrom(request.prompt_token_ids)
        else:
            engine_request.prompt_text = request.prompt_text
        stub = self._channels.stub(admission.rank.address)
        call = stub.Generate(engine_request, timeout=self._call_timeout(context))
        context.add_callback(call.cancel)
        finished = False
        for chunk in watched_chunks(self._watch, admission.rank.rank_id, call):
            if chunk.HasField("usage"):
                # The turn's reuse and first token are the context rank's.
                chunk.usage.cached_tokens = handoff.usage.cached_tokens
                chunk.usage.ttft_seconds = handoff.usage.ttft_seconds
            finished = finished or chunk.finished
            chunk.request_id = request_id
            placement = admission.placement.value if first else ""
            first = False
            yield router_pb2.GenerateResponse(
                chunk=chunk, rank_id=admission.rank.rank_id, placement=placement
            )
        if not finished:
            raise TruncatedStream(
                f"generation rank {admission.rank.rank_id} ended the stream before the turn "
                "finished"
            )
