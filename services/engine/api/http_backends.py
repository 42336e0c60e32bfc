"""Generate backends behind the OpenAI HTTP app: one engine core in-process, or the router.

The HTTP layer turns a body into a `BackendRequest` and reads `SampleOutput`s back; which
backend answers is the only difference between an engine's HTTP port and the fleet's.
Nothing here imports torch: the router process serves the OpenAI API through RouterBackend.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import grpc

from ....proto import common_pb2, router_pb2, router_pb2_grpc
from ....proto.limits import GRPC_MESSAGE_OPTIONS
from ..core.detokenizer import StopChecker
from ..core.grammar_compiler import GrammarCompiler, compile_grammar
from ..model.tokenizer import Tokenizer
from ..request.engine_request import (
    EngineStoppedError,
    GenerateCall,
    InvalidRequestError,
    SampleOutput,
    SequenceFailedError,
    ServedBy,
    Usage,
)
from ..request.sampling_params import SamplingParams, TokenLogprob
from .loop_wakes import LoopWakes

if TYPE_CHECKING:
    from ..config.model_config import ModelConfig
    from ..core.engine_core import EngineCore

ROUTER_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class BackendRequest:
    """A validated request, prompt already tokenized."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    conversation_id: str | None = None
    num_samples: int = 1
    cache_salt: str = ""
    branch_hints: tuple[int, ...] = ()
    retention_seconds: int = 0  # the client's cache TTL (GenerateCall.retention_seconds)


def model_card(model: ModelConfig) -> dict[str, int]:
    """What `/v1/models` tells of the model besides its name: the context length (vLLM's
    `max_model_len`) and the vocabulary size, so that clients sending token ids stay inside."""
    return {"max_model_len": model.max_position, "vocab_size": model.vocab_size}


class GenerateBackend(Protocol):
    """What the OpenAI app needs: a tokenizer, model names and card, and a stream of outputs."""

    tokenizer: Tokenizer
    model_names: tuple[str, ...]
    model_card: Mapping[str, int]
    # The longest request (prompt + output) the backend takes; None: unknown.
    max_request_tokens: int | None

    def generate(self, request: BackendRequest) -> AsyncIterator[SampleOutput]:
        """Outputs until every sample finished; InvalidRequestError for bad input."""
        ...


class EngineBackend:
    """Calls an engine core in this process."""

    def __init__(self, core: EngineCore, tokenizer: Tokenizer, model_names: tuple[str, ...]):
        self.core = core
        self.tokenizer = tokenizer
        self.model_names = model_names
        self.model_card = model_card(core.model_config)
        self.max_request_tokens: int | None = core.max_request_tokens()
        self._grammars = GrammarCompiler(tokenizer)
        # Per event loop serving streams here: the core thread's wakes of its readers.
        self._wakes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWakes] = (
            weakref.WeakKeyDictionary()
        )

    def _wakes_of(self, loop: asyncio.AbstractEventLoop):
        """The wake call of `loop`'s streams (one `LoopWakes` per loop)."""
        wakes = self._wakes.get(loop)
        if wakes is None:
            wakes = self._wakes[loop] = LoopWakes(loop)
        return wakes.wake

    async def generate(self, request: BackendRequest) -> AsyncIterator[SampleOutput]:
        stops = request.sampling.stop
        grammar = None
        if request.sampling.grammar:  # compiling takes a while: off the loop (no GIL held)
            grammar = await asyncio.to_thread(compile_grammar, self._grammars, request.sampling)
        handle = self.core.submit(
            GenerateCall(
                request.request_id,
                request.prompt_token_ids,
                request.sampling,
                request.conversation_id,
                request.num_samples,
                StopChecker(self.tokenizer, stops).hit if stops else None,
                request.cache_salt,
                request.branch_hints,
                grammar,
                request.retention_seconds,
            )
        )
        # The core thread wakes this loop when it queues an output: no thread waits per
        # request (a pool of them capped how many streams advanced at once).
        arrived = asyncio.Event()
        handle.wake_on_put(functools.partial(self._wakes_of(asyncio.get_running_loop()), arrived))
        try:
            while not handle.done:
                arrived.clear()
                output = handle.poll()
                if output is None:
                    await arrived.wait()
                    continue
                yield output
        finally:
            handle.cancel()  # a client that went away frees its pages


def sampling_to_proto(sampling: SamplingParams) -> common_pb2.SamplingParams:
    """The proto form of validated sampling params (what the router forwards to a rank)."""
    proto = common_pb2.SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        stop_token_ids=list(sampling.stop_token_ids),
        stop=list(sampling.stop),
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
    )
    if sampling.seed is not None:
        proto.seed = sampling.seed
    if sampling.logprobs is not None:
        proto.logprobs = sampling.logprobs
    proto.grammar = sampling.grammar
    return proto


class RouterBackend:
    """Calls the router's gRPC Generate, so conversation affinity applies."""

    def __init__(
        self,
        router_address: str,
        tokenizer: Tokenizer,
        model_names: tuple[str, ...],
        card: Mapping[str, int] | None = None,
        max_request_tokens: int | None = None,
    ):
        """`max_request_tokens`: the ranks' longest request (`EngineCore.max_request_tokens`);
        None: the card's context, else unknown."""
        self.tokenizer = tokenizer
        self.model_names = model_names
        self.model_card = dict(card or {})
        self.max_request_tokens = max_request_tokens or self.model_card.get("max_model_len")
        self._address = router_address
        # An asyncio channel, made on the serving loop at the first request: each stream is
        # awaited there, where a blocking stub parked a pool thread per stream (the pool's
        # size then capped the streams that advanced, and chunks queued behind waiting turns).
        self._channel: grpc.aio.Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        """Close the channel on its loop while that still runs (a stopped loop took its
        streams with it)."""
        channel, loop = self._channel, self._loop
        self._channel = None
        if channel is not None and loop is not None and loop.is_running():
            with contextlib.suppress(RuntimeError, TimeoutError):  # it stopped since the check
                asyncio.run_coroutine_threadsafe(channel.close(), loop).result(timeout=5)

    def _stub(self) -> router_pb2_grpc.RouterStub:
        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            self._channel = grpc.aio.insecure_channel(self._address, options=GRPC_MESSAGE_OPTIONS)
            self._loop = loop
        return router_pb2_grpc.RouterStub(self._channel)

    async def generate(self, request: BackendRequest) -> AsyncIterator[SampleOutput]:
        sampling = request.sampling
        call = self._stub().Generate(
            router_pb2.GenerateRequest(
                request_id=request.request_id,
                conversation_id=request.conversation_id or "",
                prompt_token_ids=common_pb2.TokenIds(ids=list(request.prompt_token_ids)),
                sampling=sampling_to_proto(sampling),
                max_tokens=sampling.max_tokens,
                child_samples=request.num_samples - 1,
                cache_salt=request.cache_salt,
                branch_hints=request.branch_hints,
                retention_seconds=request.retention_seconds,
            ),
            # NOTE: the router forwards the remaining deadline; with none it gets none left.
            timeout=ROUTER_TIMEOUT_SECONDS,
        )
        try:
            first = True  # the router names the rank and placement on the first response
            async for response in call:
                named = first and response.rank_id
                served = ServedBy(response.rank_id, response.placement) if named else None
                yield _output(response.chunk, served)
                first = False
        except grpc.RpcError as error:
            raise _http_error(error) from error
        finally:
            call.cancel()


def _http_error(error: grpc.RpcError) -> Exception:
    """The engine error a router status stands for (the HTTP layer maps those to bodies)."""
    code, details = error.code(), error.details() or ""
    if details.startswith("rank "):  # the router passes on an engine's refusal
        details = details.partition(": ")[2]
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, message = details.partition(": ")
        return InvalidRequestError(field, message)
    if code == grpc.StatusCode.INTERNAL:
        return SequenceFailedError(details)
    return EngineStoppedError(f"router: {code.name} {details}")


def _output(chunk: common_pb2.GenerationChunk, served_by: ServedBy | None = None) -> SampleOutput:
    usage = None
    if chunk.HasField("usage"):
        u = chunk.usage
        usage = Usage(
            u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.ttft_seconds, 0.0,
            u.cache_write_tokens,
        )  # fmt: skip
    return SampleOutput(
        chunk.request_id,
        chunk.sample_index,
        tuple(chunk.token_ids),
        chunk.finished,
        chunk.finish_reason,
        usage,
        tuple(logprob_from_proto(item) for item in chunk.logprobs),
        served_by,
    )


def logprob_from_proto(item: common_pb2.TokenLogprob) -> TokenLogprob:
    top = tuple(zip(item.top_token_ids, item.top_logprobs, strict=True))
    return TokenLogprob(item.token_id, item.logprob, top)
