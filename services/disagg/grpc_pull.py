"""The direct hand-off: `Engine.PullKvBlocks` served by the context rank (or a moved turn's
home), pulled by the receiver."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import grpc

from ...proto import engine_pb2, engine_pb2_grpc
from ...proto.limits import GRPC_MESSAGE_OPTIONS
from .blocks import KVBlock
from .transport_types import FetchRequest, TransportError


def block_to_proto(block: KVBlock, life_cycles: Sequence[str]) -> engine_pb2.KvBlockData:
    """The wire form of one block (the life cycle as its index in the model's order)."""
    return engine_pb2.KvBlockData(
        block_hash=block.block_hash,
        layer_group=life_cycles.index(block.life_cycle),
        data=block.data,
        crc32=block.crc32,
        block_index=block.index,
    )


def block_from_proto(message: engine_pb2.KvBlockData, life_cycles: Sequence[str]) -> KVBlock:
    """A received block; TransportError on a bad group or checksum."""
    if message.layer_group >= len(life_cycles):
        raise TransportError(f"layer_group {message.layer_group} >= {len(life_cycles)} groups")
    block = KVBlock(
        life_cycles[message.layer_group], message.block_index, message.block_hash, message.data
    )
    if block.crc32 != message.crc32:
        raise TransportError(
            f"block {block.index} of {block.life_cycle!r}: crc32 {block.crc32:#x} != "
            f"{message.crc32:#x}"
        )
    return block


class GrpcPull:
    """The `grpc` transport: one streaming call to the context rank, one channel per address."""

    name = "grpc"

    def __init__(self, life_cycles: Sequence[str]) -> None:
        self.life_cycles = tuple(life_cycles)
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def fetch(self, request: FetchRequest) -> list[KVBlock]:
        """Pull every block after the held prefix; TransportError names the status."""
        if not request.source_address:
            raise TransportError("no source address to pull from")
        stub = engine_pb2_grpc.EngineStub(self._channel(request.source_address))
        pull = engine_pb2.KvPullRequest(
            request_id=request.request_id, block_hashes=list(request.held_hashes)
        )
        if request.prompt:  # a moved turn's prefix (prefix_pull.py)
            pull.prompt_token_ids.ids.extend(request.prompt)
            pull.cache_salt = request.cache_salt
        try:
            call = stub.PullKvBlocks(pull, timeout=request.timeout_seconds)
            return [block_from_proto(message, self.life_cycles) for message in call]
        except grpc.RpcError as error:
            raise TransportError(
                f"PullKvBlocks from {request.source_address}: {error.code().name} {error.details()}"
            ) from error

    def done(self, request: FetchRequest) -> None:
        """Nothing kept: the context rank released its hold when it was pulled."""

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                # NOTE: one block is one message: a page of a large model (8 MiB for 8b at 64
                # tokens) is over gRPC's default 4 MiB receive limit.
                self._channels[address] = grpc.insecure_channel(address, GRPC_MESSAGE_OPTIONS)
            return self._channels[address]


def serve_pull(export, life_cycles: Sequence[str], request, context) -> Iterator:
    """Stream the blocks `export(request_id, held_hashes)` returns (run on the core thread)."""
    blocks = export(request.request_id, tuple(request.block_hashes))
    for block in blocks:
        yield block_to_proto(block, life_cycles)
