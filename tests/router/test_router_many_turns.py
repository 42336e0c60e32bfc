"""One router replica takes many more turns in flight than a rank has slots."""

from __future__ import annotations

import grpc
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until

TURNS = 300  # past the 256 threads the client pool used to have


def test_turns_past_a_fixed_pool_all_reach_the_admission_queue():
    """If this fails, the router's client pool is smaller than the turns in flight: a turn
    holds a thread while it waits, so the rest wait unqueued, outside the admission order."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    engine = FakeEngine("r0", 1, delay=0.5)  # one slot: every other turn waits at the router
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)
    calls = []
    try:
        engine.join(f"127.0.0.1:{port}")
        wait_until(lambda: len(server.runtime.ranks()) == 1)
        for i in range(TURNS):
            turn = router_pb2.GenerateRequest(
                conversation_id=f"many-{i}",
                prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3 + i]),
                max_tokens=200,
            )
            calls.append(stub.Generate(turn, timeout=120))
        # One turn streams on the slot; every other one waits in the admission queue.
        wait_until(lambda: len(server.runtime.queue) == TURNS - 1, timeout=120)
    finally:
        for call in calls:
            call.cancel()
        channel.close()
        engine.kill()
        server.stop(0)
