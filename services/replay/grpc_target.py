"""The `grpc://HOST:PORT` target: the router's `Router.Generate` stream (proto/router.proto).

The prompt goes as token ids with the conversation id, so the router pins the conversation.
TTFT is the first streamed chunk that carries tokens, on the client's clock; reused tokens are
`usage.cached_tokens` of the final chunk, as the engine rank reported them.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ...proto import common_pb2, router_pb2, router_pb2_grpc
from .prompt_layout import PromptLayout
from .records import Generation
from .target_types import TargetError, TargetInfo, WallClock

SCHEME = "grpc://"


class RouterGenerateTarget:
    """Streams generations from a kvfleet router over gRPC (one channel, many streams)."""

    def __init__(self, spec: str, *, timeout_s: float = 600.0) -> None:
        if not spec.startswith(SCHEME) or not spec[len(SCHEME) :].strip("/"):
            raise ValueError(f"target {spec!r}: expected grpc://HOST:PORT")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.address = spec[len(SCHEME) :].rstrip("/")
        self.timeout_s = timeout_s
        self.clock = WallClock()
        self._channel: grpc.aio.Channel | None = None

    def request(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
    ) -> router_pb2.GenerateRequest:
        """The GenerateRequest of one turn (greedy, exactly `max_tokens` tokens)."""
        return router_pb2.GenerateRequest(
            conversation_id=conversation_id,
            prompt_token_ids=common_pb2.TokenIds(ids=tokens),
            sampling=common_pb2.SamplingParams(temperature=0.0),
            max_tokens=max_tokens,
            branch_hints=list(branch_hints),
        )

    async def describe(self) -> TargetInfo:
        """Nothing: the router's API does not describe the ranks' model (pass --vocab-size)."""
        return TargetInfo()

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
        layout: PromptLayout | None = None,  # token ids need no layout
    ) -> Generation:
        """Stream one generation and time its chunks."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address)
        stub = router_pb2_grpc.RouterStub(self._channel)
        message = self.request(conversation_id, tokens, max_tokens, branch_hints)
        token_times: list[float] = []
        usage: common_pb2.Usage | None = None
        rank: str | None = None
        try:
            async for response in stub.Generate(message, timeout=self.timeout_s):
                rank = rank or response.rank_id or None
                chunk = response.chunk
                if chunk.token_ids:
                    token_times.append(self.clock.now())
                if chunk.HasField("usage"):
                    usage = chunk.usage
        except grpc.aio.AioRpcError as error:
            raise TargetError(
                f"router {self.address}: {error.code().name}: {error.details()}"
            ) from error
        finish = self.clock.now()
        if usage is None:
            raise TargetError(f"router {self.address}: stream ended without usage")
        prompt_tokens = usage.prompt_tokens or len(tokens)
        return Generation(
            prompt_tokens=prompt_tokens,
            cached_tokens=min(usage.cached_tokens, prompt_tokens),
            output_tokens=usage.completion_tokens or len(token_times),
            first_token_s=token_times[0] if token_times else None,
            token_times_s=tuple(token_times),
            finish_s=finish,
            rank=rank,
        )

    async def aclose(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
