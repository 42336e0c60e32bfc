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

from collections.abc import Sequence

from .transport_types import HandoffTransport, TransportContext, TransportFactory


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
