"""Faults: a rank dies mid-stream; Redis goes away and comes back."""

from __future__ import annotations

import threading
import time

import grpc
import redis
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until


def turn(conversation, max_tokens=3, **kwargs):
    return router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        max_tokens=max_tokens,
        **kwargs,
    )


def first_response(stub, request, whole=False):
    """Run a request to its end; return its first response (or its rank id)."""
    first, *_rest = stub.Generate(request, timeout=10)
    return first if whole else first.rank_id


def test_killed_rank_mid_stream_fails_cleanly_and_its_pins_move():
    """A dead rank would hang its streams or keep attracting its conversations."""
    # Generous: the survivor's heartbeats (every 0.1 s) must never miss it, even through the
    # pauses of a loaded machine; only the killed rank's stop for good.
    config = RouterConfig(admission=AdmissionConfig(heartbeat_timeout_seconds=5.0))
    server, port = create_server("127.0.0.1:0", config)
    doomed, survivor = FakeEngine("r0", 2, delay=0.05), FakeEngine("r1", 2)
    doomed.join(f"127.0.0.1:{port}")
    survivor.join(f"127.0.0.1:{port}")
    wait_until(lambda: len(server.runtime.ranks()) == 2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        list(stub.Generate(turn("conv-k", max_tokens=1, rank_id="r0"), timeout=10))
        outcome: dict = {}

        def second_turn() -> None:
            try:
                outcome["responses"] = list(
                    stub.Generate(turn("conv-k", max_tokens=40), timeout=60)
                )
            except grpc.RpcError as error:
                outcome["error"] = error

        worker = threading.Thread(target=second_turn)
        doomed.first_chunk_sent.clear()
        worker.start()
        assert doomed.first_chunk_sent.wait(60)
        doomed.kill()
        worker.join(timeout=60)
        assert not worker.is_alive()
        if "error" in outcome:
            assert outcome["error"].code() == grpc.StatusCode.UNAVAILABLE
            assert "rank r0 failed" in outcome["error"].details()
        else:
            assert outcome["responses"][-1].chunk.finished
        wait_until(lambda: "r0" not in server.runtime.ranks())
        third = list(stub.Generate(turn("conv-k"), timeout=10))
        assert (third[0].rank_id, third[0].placement) == ("r1", "new")
        server.runtime.store.check_integrity()
    finally:
        channel.close()
        survivor.kill()
        server.stop(0)


def test_rank_dead_before_output_is_retried_elsewhere():
    """A request admitted onto a rank that just died would fail though another rank is free."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    dead, alive = FakeEngine("r0", 2), FakeEngine("r1", 2)
    dead.join(f"127.0.0.1:{port}")
    alive.join(f"127.0.0.1:{port}")
    wait_until(lambda: len(server.runtime.ranks()) == 2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        list(stub.Generate(turn("conv-r", max_tokens=1, rank_id="r0"), timeout=10))
        dead.kill()  # still registered: its heartbeat timeout has not passed
        responses = list(stub.Generate(turn("conv-r"), timeout=10))
        assert (responses[0].rank_id, responses[-1].chunk.finished) == ("r1", True)
        assert server.metrics.retries._value.get() == 1
        server.runtime.store.check_integrity()
    finally:
        channel.close()
        alive.kill()
        server.stop(0)


def test_redis_outage_keeps_serving_then_pins_are_recovered(own_redis):
    """A Redis outage would stop the fleet, or lose the pins made while it was away."""
    config = RouterConfig(redis_url=own_redis.url, redis_prefix="outage", redis_timeout_seconds=0.5)
    server, port = create_server("127.0.0.1:0", config)
    engines = [FakeEngine("r0", 2), FakeEngine("r1", 2)]
    for engine in engines:
        engine.join(f"127.0.0.1:{port}")
    wait_until(lambda: len(server.runtime.ranks()) == 2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        before = first_response(stub, turn("conv-before"))
        own_redis.stop()
        during = first_response(stub, turn("conv-during"))
        again = first_response(stub, turn("conv-before"), whole=True)
        assert (again.rank_id, again.placement) == (before, "pinned")
        assert server.runtime.degraded
        assert server.metrics.degraded._value.get() == 1
        assert server.metrics.redis_errors._value.get() >= 1
        own_redis.start()  # empty: no persistence
        wait_until(lambda: not server.runtime.degraded)
        client = redis.Redis(port=own_redis.port, decode_responses=True)
        assert client.get("outage:pin:conv-before") == before
        assert client.get("outage:pin:conv-during") == during
        assert sorted(client.hkeys("outage:ranks")) == ["r0", "r1"]
        client.close()
        server.runtime.store.check_integrity()
    finally:
        channel.close()
        for engine in engines:
            engine.kill()
        server.stop(0)
        time.sleep(0)
