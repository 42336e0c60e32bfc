"""A fake engine rank for the grpc target's tests: a real Engine gRPC server with one infinite
prefix cache, registered with a real router.

It reports `cached_tokens` as the longest run of whole `block_size` blocks of the prompt it has
seen before as a prefix (capped one token short of the prompt), like an engine with a cache that
never evicts. It registers once and never heartbeats: tests set a long heartbeat timeout.
"""

from __future__ import annotations

import threading

import grpc
from kvfleet.proto import common_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.proto.pooled_server import PooledServer


class PrefixCacheRank(engine_pb2_grpc.EngineServicer):
    """Streams one token per chunk; the last chunk's usage carries the cached prefix."""

    def __init__(self, rank_id: str, block_size: int = 64, max_batch_size: int = 4) -> None:
        self.rank_id = rank_id
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.conversations: list[str] = []
        self._prefixes: set[tuple[int, ...]] = set()
        self._lock = threading.Lock()
        self._server = PooledServer(8, f"fake-{rank_id}")
        engine_pb2_grpc.add_EngineServicer_to_server(self, self._server)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def cached_tokens(self, prompt: list[int]) -> int:
        """Tokens of the longest seen block-prefix, then remember every block-prefix."""
        size = self.block_size
        blocks = [tuple(prompt[i : i + size]) for i in range(0, len(prompt) - size + 1, size)]
        keys, parent = [], ()
        for block in blocks:
            parent = (*parent[-1:], hash((parent, block)))
            keys.append(parent[-1])
        with self._lock:
            hits = 0
            while hits < len(keys) and keys[hits] in self._prefixes:
                hits += 1
            self._prefixes.update(keys)
        return min(hits * size, len(prompt) - 1)

    def Generate(self, request, context):
        prompt = list(request.prompt_token_ids.ids)
        with self._lock:
            self.conversations.append(request.conversation_id)
        cached = self.cached_tokens(prompt)
        for i in range(request.max_tokens):
            done = i == request.max_tokens - 1
            usage = (
                common_pb2.Usage(
                    prompt_tokens=len(prompt),
                    cached_tokens=cached,
                    completion_tokens=request.max_tokens,
                    ttft_seconds=0.001,
                )
                if done
                else None
            )
            yield common_pb2.GenerationChunk(
                request_id=request.request_id,
                token_ids=[i + 1],
                finished=done,
                finish_reason="length" if done else "",
                usage=usage,
            )

    def register(self, router_address: str) -> None:
        """Register with the router (once)."""
        with grpc.insecure_channel(router_address) as channel:
            router_pb2_grpc.RankRegistryStub(channel).Register(
                router_pb2.RegisterRequest(
                    rank_id=self.rank_id,
                    address=self.address,
                    max_batch_size=self.max_batch_size,
                    role=common_pb2.RANK_ROLE_BOTH,
                    block_size=self.block_size,
                ),
                timeout=5,
            )

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop(0).wait(5)
