"""How the dynamo arms pick a rank: ai-dynamo-runtime's KvRouter or its RadixTree.

Runs under the dynamo venv (`.venv-dynamo`, ai-dynamo-runtime 1.6.1), so it imports only the
standard library and `dynamo`. Every picker is driven from one asyncio loop:
`pick(request_id, tokens) -> rank index`, then `first_token(request_id)` when the rank streams
its first chunk and `done(request_id)` when the answer ends (or fails).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

ENDPOINT = "kvfleet.sim.generate"
START_TIMEOUT_S = 30.0
# dynamo's listeners (TCP request and response planes, ZMQ event plane, status server) bind a
# host found from the machine's interfaces unless told; keep every one on loopback.
LOOPBACK_ENV = {
    name: "127.0.0.1"
    for name in (
        "DYN_TCP_RPC_HOST",
        "DYN_TCP_RESPONSE_STREAM_HOST",
        "DYN_EVENT_PLANE_HOST",
        "DYN_SYSTEM_HOST",
    )
}


class Picker(Protocol):
    async def pick(self, request_id: str, tokens: list[int]) -> int: ...
    async def first_token(self, request_id: str) -> None: ...
    async def done(self, request_id: str) -> None: ...
    async def close(self) -> None: ...


@dataclass
class PickerSettings:
    """What every picker is built from (the router's command line)."""

    ranks: int
    block_size: int
    model_path: str
    workdir: Path


@dataclass
class RadixTreePicker:
    """dynamo's RadixTree: most prefix blocks wins, ties go to the rank with fewest in flight.

    The tree learns from what was routed: after a pick it applies a `stored` event for the
    prompt's full blocks on that rank (dynamo's event JSON). It hears no removals (the ranks'
    evictions never reach it), so it only grows, as an approximate router's tree does between
    its TTL expiries.
    """

    settings: PickerSettings
    in_flight: list[int] = field(default_factory=list)
    rank_of: dict[str, int] = field(default_factory=dict)
    event_id: int = 0

    def __post_init__(self) -> None:
        from dynamo.llm import RadixTree

        self.tree = RadixTree()
        self.in_flight = [0] * self.settings.ranks

    async def pick(self, request_id: str, tokens: list[int]) -> int:
        from dynamo.llm import compute_block_hash_for_seq

        hashes = compute_block_hash_for_seq(tokens, self.settings.block_size)
        scores = self.tree.find_matches(hashes).scores  # {(worker_id, dp_rank): blocks}
        overlap = [scores.get((rank, 0), 0) for rank in range(self.settings.ranks)]
        rank = min(range(self.settings.ranks), key=lambda r: (-overlap[r], self.in_flight[r], r))
        self.in_flight[rank] += 1
        self.rank_of[request_id] = rank
        if hashes:
            self._store(rank, hashes)
        return rank

    def _store(self, rank: int, hashes: list[int]) -> None:
        """Record the prompt's blocks as cached on `rank`: one stored event from the root."""
        self.event_id += 1
        blocks = [{"block_hash": h, "tokens_hash": h} for h in hashes]
        event = {
            "event_id": self.event_id,
            "data": {"stored": {"parent_hash": None, "blocks": blocks}},
            "dp_rank": 0,
        }
        self.tree.apply_event(rank, json.dumps(event).encode())

    async def first_token(self, request_id: str) -> None:
        return None

    async def done(self, request_id: str) -> None:
        rank = self.rank_of.pop(request_id, None)
        if rank is not None:
            self.in_flight[rank] -= 1

    async def close(self) -> None:
        return None


async def _stub_handler(request, *_):
    """The ranks' dynamo endpoints are never called: requests go to the ranks over HTTP."""
    raise RuntimeError("kvfleet ranks are reached over HTTP, not dynamo's request plane")
    yield  # an async generator, as serve_endpoint expects


@dataclass
class KvRouterPicker:
    """dynamo's KvRouter: its own cost (prefill blocks left after overlap + decode load).

    No etcd and no NATS: discovery is dynamo's `file` backend in the workdir, event plane ZMQ.
    Each rank is one dynamo endpoint instance (its own DistributedRuntime in this process,
    registered with the rank's model directory) whose handler is never called. KV events are
    off (`use_kv_events=False`): its approximate indexer learns from what it routed
    (`update_indexer=True`, TTL 120 s). Each request is tracked from `best_worker` through
    `mark_prefill_complete` (first chunk) to `free`, which is the load the cost reads.
    """

    settings: PickerSettings
    rank_of_worker: dict[int, int] = field(default_factory=dict)

    async def start(self) -> KvRouterPicker:
        os.environ.update(LOOPBACK_ENV, DYN_FILE_KV=str(self.settings.workdir / "discovery"))
        os.environ.setdefault("DYN_SELF_HOST_METADATA", "0")
        from dynamo.llm import (
            KvRouter,
            KvRouterConfig,
            ModelInput,
            ModelType,
            WorkerType,
            register_model,
        )
        from dynamo.runtime import DistributedRuntime

        loop = asyncio.get_running_loop()
        self.runtimes = []
        self.serving = []
        for rank in range(self.settings.ranks):
            runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
            endpoint = runtime.endpoint(ENDPOINT)
            await register_model(
                ModelInput.Tokens,
                ModelType.Completions,
                endpoint,
                self.settings.model_path,
                "kvfleet",
                worker_type=WorkerType.Aggregated,
                kv_cache_block_size=self.settings.block_size,
                ignore_weights=True,
            )
            self.serving.append(asyncio.ensure_future(endpoint.serve_endpoint(_stub_handler)))
            self.rank_of_worker[endpoint.connection_id()] = rank
            self.runtimes.append(runtime)
        router_runtime = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
        self.runtimes.append(router_runtime)
        endpoint = router_runtime.endpoint(ENDPOINT)
        await _wait_for_instances(endpoint, set(self.rank_of_worker))
        config = KvRouterConfig(use_kv_events=False)
        self.router = KvRouter(endpoint, self.settings.block_size, config)
        return self

    async def pick(self, request_id: str, tokens: list[int]) -> int:
        worker, _dp_rank, _overlap = await self.router.best_worker(
            tokens, request_id=request_id, update_indexer=True
        )
        if worker not in self.rank_of_worker:
            raise RuntimeError(f"KvRouter picked worker {worker}, not one of the ranks")
        return self.rank_of_worker[worker]

    async def first_token(self, request_id: str) -> None:
        await self.router.mark_prefill_complete(request_id)

    async def done(self, request_id: str) -> None:
        await self.router.free(request_id)

    async def close(self) -> None:
        for future in self.serving:
            future.cancel()
        for runtime in self.runtimes:
            runtime.shutdown()


async def _wait_for_instances(endpoint, expected: set[int]) -> None:
    """Until discovery lists every rank's instance (bounded by START_TIMEOUT_S)."""
    client = await endpoint.client()
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    while set(client.instance_ids()) != expected:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(
                f"dynamo discovery lists {sorted(client.instance_ids())}, expected "
                f"{sorted(expected)} within {START_TIMEOUT_S} s"
            )
        await asyncio.sleep(0.1)


async def _radix_tree(settings: PickerSettings) -> Picker:
    return RadixTreePicker(settings)


async def _kv_router(settings: PickerSettings) -> Picker:
    return await KvRouterPicker(settings).start()


# policy name -> async factory (run on the router's asyncio loop)
POLICIES: dict[str, Callable[[PickerSettings], object]] = {
    "kv_router": _kv_router,
    "radix_tree": _radix_tree,
}
