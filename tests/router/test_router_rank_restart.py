"""A rank restarted at its old address serves at once: the router's channel to that address saw
the old process die and sits in gRPC's reconnect backoff, so reusing it would fail the first
calls with "connection refused" and remove the healthy rank again."""

from __future__ import annotations

import grpc
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until


def turn(conversation: str) -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        max_tokens=2,
        rank_id="r0",
    )


def test_a_rank_restarted_at_its_address_is_served_not_removed_again():
    server, port = create_server("127.0.0.1:0", RouterConfig())
    router = f"127.0.0.1:{port}"
    first = FakeEngine("r0", 2)
    restarted = None
    channel = grpc.insecure_channel(router)
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        first.join(router)
        wait_until(lambda: "r0" in server.runtime.ranks())
        assert list(stub.Generate(turn("c1"), timeout=30))[-1].chunk.finished
        first.kill()
        # The router learns of the death from a failed call, and removes the rank.
        try:
            list(stub.Generate(turn("c2"), timeout=30))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
        wait_until(lambda: "r0" not in server.runtime.ranks())
        restarted = FakeEngine("r0", 2, port=first.port)
        restarted.join(router)
        wait_until(lambda: "r0" in server.runtime.ranks())
        responses = list(stub.Generate(turn("c3"), timeout=30))
        assert responses[-1].chunk.finished
        assert server.metrics.ranks_removed._value.get() == 1  # only the dead process
    finally:
        channel.close()
        if restarted is not None:
            restarted.kill()
        server.stop(0)
