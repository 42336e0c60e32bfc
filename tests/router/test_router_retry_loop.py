"""The retry loop, in both placements of a turn (a rank of its own, and the generation half of
a hand-off): an early-ended stream is retried, a full pool fails at the queue limit."""

from __future__ import annotations

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.handoff import MAX_FULL_REQUEUES
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until

PATHS = ("aggregated", "handoff")


def turn(conversation: str) -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        max_tokens=3,
    )


@pytest.fixture
def fleet():
    """Makes (router, stub, serving rank, first rank) for a path: one rank of both roles, or
    a context rank (the first) and a generation rank (the serving one); stops everything it
    made."""
    made = []

    def make(path: str, **config):
        server, port = create_server("127.0.0.1:0", RouterConfig(**config))
        if path == "aggregated":
            engines = [FakeEngine("r0", 2)]
        else:
            engines = [
                FakeEngine("ctx", 2, role=common_pb2.RANK_ROLE_CONTEXT),
                FakeEngine("gen", 2, role=common_pb2.RANK_ROLE_GENERATION),
            ]
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        made.append((server, engines, channel))
        for engine in engines:
            engine.join(f"127.0.0.1:{port}")
        wait_until(lambda: len(server.runtime.ranks()) == len(engines))
        return server, router_pb2_grpc.RouterStub(channel), engines[-1], engines[0]

    yield make
    for server, engines, channel in made:
        channel.close()
        for engine in engines:
            engine.kill()
        server.runtime.store.check_integrity()
        server.stop(0)


@pytest.mark.parametrize("path", PATHS)
def test_a_stream_ended_before_output_is_placed_again(fleet, path):
    """A rank that closes the stream at once would fail a turn that another try serves."""
    server, stub, serving, _ = fleet(path)
    serving.end_early_times = 1
    responses = list(stub.Generate(turn(f"early-{path}"), timeout=30))
    assert responses[-1].chunk.finished
    assert responses[-1].rank_id == serving.rank_id
    assert serving.generate_calls == 2
    assert server.metrics.retries._value.get() == 1
    # The early end took the rank for dead; it came back by its next heartbeat.
    assert server.metrics.ranks_removed._value.get() == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_pool_that_stays_full_fails_at_the_queue_limit(fleet, path):
    """Requeueing past the queue limit would hold the client (and a parked hand-off) for as
    many backoffs as the loop allows, not the limit the operator set."""
    server, stub, serving, _ = fleet(path, max_queue_seconds=1.0)
    serving.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(turn(f"full-{path}"), timeout=60))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "had room within 1 s" in caught.value.details()
    # The doubling pauses (0.02 s, then 0.04, ... capped at 0.5) pass 1 s by the 6th requeue.
    assert 1 <= server.metrics.requeued_full._value.get() <= 6 < MAX_FULL_REQUEUES
    assert server.metrics.ranks_removed._value.get() == 0


def test_retried_halves_of_a_hand_off_keep_the_turn_id_and_find_the_parked_kv(fleet):
    """If this fails, a hand-off whose context half was placed twice shows the client the
    attempt's id (`id~2`), or sends the generation rank to pull KV parked under an id the
    context rank never had, or retries the generation half under the id of the attempt it
    replaces (refused as running by a rank that still holds it)."""
    _server, stub, generation, context_rank = fleet("handoff")
    context_rank.end_early_times = 1
    generation.end_early_times = 1
    request = turn("both-halves-retried")
    request.request_id = "turn-7"
    responses = list(stub.Generate(request, timeout=30))
    assert responses[-1].chunk.finished
    assert {r.chunk.request_id for r in responses} == {"turn-7"}
    assert context_rank.served == ["turn-7", "turn-7~2"]
    assert generation.served == ["turn-7", "turn-7~2"]
    assert generation.kv_sources == ["turn-7~2", "turn-7~2"]
