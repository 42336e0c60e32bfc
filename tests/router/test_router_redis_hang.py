"""A hung Redis (SIGSTOP): heartbeats, KV events and admissions go on from local state."""

from __future__ import annotations

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

# A Redis call waits this long before it counts as failed; every call made on behalf of a rank
# or a client below must finish well inside it, so none of them waited on Redis.
REDIS_TIMEOUT = 16.0
CALL_DEADLINE = 8.0


def test_a_hung_redis_holds_up_no_heartbeat_kv_event_or_admission(own_redis):
    """Retrying a hung Redis under the admission lock stalls every heartbeat, KV event and
    admission behind each retry's timeout."""
    config = RouterConfig(
        redis_url=own_redis.url,
        redis_prefix="hang",
        redis_timeout_seconds=REDIS_TIMEOUT,
        redis_retry_seconds=0.05,
    )
    server, port = create_server("127.0.0.1:0", config)
    engine = FakeEngine("r0", 4)
    engine.join(f"127.0.0.1:{port}")
    wait_until(lambda: "r0" in server.runtime.ranks())
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    router = router_pb2_grpc.RouterStub(channel)
    registry = router_pb2_grpc.RankRegistryStub(channel)
    turn = router_pb2.GenerateRequest(
        conversation_id="conv-h", prompt_token_ids=common_pb2.TokenIds(ids=[1]), max_tokens=1
    )
    try:
        list(router.Generate(turn, timeout=10))
        own_redis.pause()
        wait_until(lambda: server.runtime.degraded, timeout=4 * REDIS_TIMEOUT)
        for _ in range(10):
            reply = registry.Heartbeat(
                router_pb2.HeartbeatRequest(rank_id="r0", load=router_pb2.RankLoad(free_slots=4)),
                timeout=CALL_DEADLINE,
            )
            assert reply.registered
            batch = router_pb2.KvEventBatch(
                rank_id="r0", events=[router_pb2.KvEvent(cleared=router_pb2.AllBlocksCleared())]
            )
            ack = registry.PublishKvEvents(iter([batch]), timeout=CALL_DEADLINE)
            assert ack.events_applied == 1
            responses = list(router.Generate(turn, timeout=CALL_DEADLINE))
            assert responses[-1].chunk.finished
        assert server.runtime.degraded
    finally:
        own_redis.resume()
        channel.close()
        engine.kill()
        server.stop(0)
