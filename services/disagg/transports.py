"""How a generation rank fetches a request's KV: transports picked by name from a registry.

A transport gets a `FetchRequest` (which blocks the receiver still needs) and returns the
blocks it could get; the generation side tries the rank's transports in order until the blocks
it must have are there. `grpc` pulls from the context rank (`PullKvBlocks`); `disk` reads what
the context rank wrote through to the shared disk tier when it parked the request.

NOTE: an RDMA / NIXL transport registers here too. Its `fetch` would post one-sided reads of
the context rank's registered KV pages (addresses exchanged in the pull's metadata) straight
into the receiver's pages instead of copying bytes through messages; the reserve / install
steps in `generation_side.py` stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvfleet.kvstore.tiers.layout import KVLayout

from .blocks import KVBlock


class TransportError(RuntimeError):
    """A transport could not deliver (source gone, timeout, bad bytes, nothing on disk)."""


@dataclass(frozen=True)
class FetchRequest:
    """What the receiver asks for: blocks after the prefix it holds, per life cycle.

    `wanted[lc]` lists `(index, block_hash)` of every block the receiver would take (hash 0:
    the partial last block); `held_hashes` are the chained hashes of the prefix it holds.
    """

    request_id: str
    source_address: str
    held_hashes: tuple[int, ...]
    wanted: Mapping[str, tuple[tuple[int, int], ...]]
    timeout_seconds: float


class HandoffTransport(Protocol):
    name: str

    def fetch(self, request: FetchRequest) -> list[KVBlock]:
        """The blocks this transport could get; raises TransportError when it got nothing."""

    def done(self, request: FetchRequest) -> None:
        """The hand-off completed (by any transport): drop what was kept only for it."""

    def close(self) -> None:
        """Release connections."""


@dataclass(frozen=True)
class TransportContext:
    """What a transport may need: the life cycles in wire order, the page layout, the disk."""

    life_cycles: tuple[str, ...]
    layout: KVLayout
    disk_dir: str = ""
    options: Mapping[str, object] = field(default_factory=dict)


# A factory returns None when the rank cannot use the transport (no disk tier configured).
TransportFactory = Callable[[TransportContext], "HandoffTransport | None"]


def _grpc(context: TransportContext) -> HandoffTransport:
    from .grpc_pull import GrpcPull

    return GrpcPull(context.life_cycles)


def _disk(context: TransportContext) -> HandoffTransport | None:
    from .disk_handoff import DiskHandoff

    return DiskHandoff(context.disk_dir, context.layout) if context.disk_dir else None


HANDOFF_TRANSPORTS: dict[str, TransportFactory] = {"grpc": _grpc, "disk": _disk}


def build_transports(names: Sequence[str], context: TransportContext) -> list[HandoffTransport]:
    """The named transports, in order, leaving out those this rank cannot use."""
    unknown = [name for name in names if name not in HANDOFF_TRANSPORTS]
    if unknown:
        known = sorted(HANDOFF_TRANSPORTS)
        raise ValueError(f"handoff_transports: unknown {unknown}; known: {known}")
    built = (HANDOFF_TRANSPORTS[name](context) for name in names)
    return [transport for transport in built if transport is not None]
