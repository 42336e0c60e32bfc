"""The rank-facing gRPC servicer (RankRegistry): register, heartbeat, KV events.

It is served on the router's rank port, behind the fleet secret (see fleet_secret.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import grpc

from ...proto import common_pb2, router_pb2, router_pb2_grpc
from .model import RankInfo, RankLoad, Role
from .runtime import RouterRuntime

log = logging.getLogger(__name__)

ROLES = {
    common_pb2.RANK_ROLE_UNSPECIFIED: Role.BOTH,
    common_pb2.RANK_ROLE_BOTH: Role.BOTH,
    common_pb2.RANK_ROLE_CONTEXT: Role.CONTEXT,
    common_pb2.RANK_ROLE_GENERATION: Role.GENERATION,
}


class RankRegistryServicer(router_pb2_grpc.RankRegistryServicer):
    """Engine-facing registry: register, heartbeat, KV events."""

    def __init__(
        self,
        runtime: RouterRuntime,
        heartbeat_timeout_seconds: float,
        on_start: Callable[[RankInfo], None] = lambda _info: None,
    ) -> None:
        """`on_start` hears of a rank that registers while not live (it started, or restarted
        at an address the router may still hold a broken channel to)."""
        self._runtime = runtime
        self._on_start = on_start
        self._timeout = heartbeat_timeout_seconds
        self._interval = heartbeat_timeout_seconds / 3

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
        live = self._runtime.live_info(info.rank_id, self._timeout)
        if live is not None and live != info:
            # NOTE: re-pointing a live rank would send its pinned conversations elsewhere, and
            # resizing it would change the slots reservations are counted against under the
            # requests it holds; a rank that really moved or changed registers once the old
            # registration misses its heartbeats (a restart, which drains).
            changed = _changes(live, info)
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"rank_id: {info.rank_id!r} is live with {changed}; not changed while live",
            )
        if live is None:
            self._on_start(info)
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
        load = RankLoad(
            reported.free_slots,
            reported.queued,
            reported.kv_usage,
            reported.draining or reported.leaving,
            reported.leaving,
        )
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
        root = stored.root_hash if stored.HasField("root_hash") else None
        index.stored(
            rank_id, list(stored.block_hashes), parent, list(stored.token_ids), block_size, root
        )
    elif kind == "removed":
        index.removed(rank_id, list(event.removed.block_hashes))
    elif kind == "cleared":
        index.clear(rank_id)


def _changes(live: RankInfo, asked: RankInfo) -> str:
    """What a Register would change of a live rank, as `field live -> asked`."""
    fields = ("address", "max_batch_size", "role", "block_size")
    return ", ".join(
        f"{name} {getattr(live, name)} (asked {getattr(asked, name)})"
        for name in fields
        if getattr(live, name) != getattr(asked, name)
    )
