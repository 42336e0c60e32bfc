"""A rank never runs more than max_batch_size sequences, whatever the routers believe."""

from __future__ import annotations

import dataclasses
import threading

import grpc
import pytest
from kvfleet.proto import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until


def test_a_full_engine_refuses_more_sequences_with_resource_exhausted():
    """An engine that takes whatever it is sent runs over max_batch_size when two routers (or a
    lapsed reservation) believe it has room."""
    config = EngineConfig(model="tiny", max_batch_size=2, page_size=16, kv_pages=64)
    rank = EngineRank(config, RankAddresses()).start()
    gate = threading.Event()
    # The core thread waits here between steps: the two calls below stay running.
    holder = threading.Thread(target=lambda: rank.core.call_on_core(gate.wait, timeout=120))
    holder.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{rank.grpc_port}")
    stub = engine_pb2_grpc.EngineStub(channel)

    def call(request_id: str, samples: int = 1):
        return stub.Generate(
            engine_pb2.EngineGenerateRequest(
                request_id=request_id,
                prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
                max_tokens=2,
                num_samples=samples,
            ),
            timeout=60,
        )

    try:
        running = [call("a"), call("b")]
        wait_until(lambda: rank.engine_servicer.slots.running == 2)
        with pytest.raises(grpc.RpcError) as caught:
            list(call("c"))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_batch_size 2" in caught.value.details()
        gate.set()
        for stream in running:
            assert list(stream)[-1].finished
        wait_until(lambda: rank.engine_servicer.slots.running == 0)
        assert list(call("d", samples=2))[-1].finished
        assert rank.engine_servicer.slots.peak == 2
    finally:
        gate.set()
        holder.join(timeout=30)
        channel.close()
        rank.stop(grace=0.5)


def test_replicas_without_redis_split_a_ranks_slots(own_redis):
    """Replicas cut off from Redis each see only their own reservations: sharing blindly, two
    replicas fill a rank twice over."""
    config = RouterConfig(
        redis_url=own_redis.url, redis_prefix="split", redis_timeout_seconds=0.3, lease_seconds=1.0
    )
    routers = [
        create_server("127.0.0.1:0", dataclasses.replace(config, router_id=name))
        for name in ("replica-a", "replica-b")
    ]
    servers = [server for server, _ in routers]
    engine = FakeEngine("r0", 5, delay=0.2)
    engine.join(f"127.0.0.1:{routers[0][1]}")
    wait_until(lambda: all("r0" in s.runtime.ranks() for s in servers))
    wait_until(lambda: all(len(s.runtime.store.live_replicas) == 2 for s in servers))
    own_redis.stop()
    wait_until(lambda: all(s.runtime.degraded for s in servers))
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _, port in routers]
    streams = []
    try:
        for i in range(10):
            stub = router_pb2_grpc.RouterStub(channels[i % 2])
            request = router_pb2.GenerateRequest(
                conversation_id=f"conv-{i}",
                prompt_token_ids=common_pb2.TokenIds(ids=[1]),
                max_tokens=10_000,
            )
            streams.append(stub.Generate(request, timeout=120))

        def held(server) -> int:
            return sum(server.runtime.store.local.reservations().get("r0", {}).values())

        def settled() -> bool:
            # Every request of each replica is either admitted or waiting, and the engine runs
            # exactly what was admitted.
            placed = [held(s) + len(s.runtime.queue) for s in servers]
            return placed == [5, 5] and engine.in_flight == sum(held(s) for s in servers)

        wait_until(settled)
        assert sorted(held(s) for s in servers) == [2, 3]
        assert engine.max_in_flight <= 5
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            channel.close()
        engine.kill()
        for server in servers:
            server.stop(0)
