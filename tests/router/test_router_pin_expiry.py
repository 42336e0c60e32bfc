"""Per-conversation state is bounded: expired pins leave the router's mirror and rank_pins."""

from __future__ import annotations

import grpc
import redis
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import SHARED_REDIS_URL, FakeEngine, wait_until

CONVERSATIONS = 60


def test_expired_pins_leave_the_local_mirror_and_the_rank_pin_sets(redis_prefix):
    """Without trimming, every conversation ever seen stays in memory and in Redis."""
    config = RouterConfig(
        admission=AdmissionConfig(pin_ttl_seconds=0.5),
        redis_url=SHARED_REDIS_URL,
        redis_prefix=redis_prefix,
        pin_sweep_seconds=0.1,
    )
    server, port = create_server("127.0.0.1:0", config)
    engines = [FakeEngine("r0", 4), FakeEngine("r1", 4)]
    for engine in engines:
        engine.join(f"127.0.0.1:{port}")
    client = redis.Redis.from_url(SHARED_REDIS_URL, decode_responses=True)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        wait_until(lambda: len(server.runtime.ranks()) == 2)
        for i in range(CONVERSATIONS):
            request = router_pb2.GenerateRequest(
                conversation_id=f"conv-{i}",
                prompt_token_ids=common_pb2.TokenIds(ids=[1]),
                max_tokens=1,
            )
            list(stub.Generate(request, timeout=10))

        def pin_set_sizes() -> int:
            return sum(client.zcard(f"{redis_prefix}:rank_pins:{r}") for r in ("r0", "r1"))

        local = server.runtime.store.local
        wait_until(lambda: not local.pins() and pin_set_sizes() == 0)
        assert client.keys(f"{redis_prefix}:pin:*") == []
    finally:
        channel.close()
        for engine in engines:
            engine.kill()
        server.stop(0)
        for key in client.scan_iter(match=f"{redis_prefix}:*"):
            client.delete(key)
        client.close()
