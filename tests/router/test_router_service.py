"""The router over gRPC with fake engine ranks: forwarding, pins, bad input, health, metrics."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until


def turn(conversation, tokens=(1, 2, 3), max_tokens=3, **kwargs):
    return router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=list(tokens)),
        max_tokens=max_tokens,
        **kwargs,
    )


@pytest.fixture
def fleet():
    """A router (in-process store) with two fake ranks of 2 slots each."""
    config = RouterConfig(admission=AdmissionConfig(max_wait_passes=2))
    server, port = create_server("127.0.0.1:0", config)
    engines = [FakeEngine("r0", 2), FakeEngine("r1", 2)]
    for engine in engines:
        engine.join(f"127.0.0.1:{port}")
    wait_until(lambda: len(server.runtime.ranks()) == 2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield server, router_pb2_grpc.RouterStub(channel), engines, channel
    channel.close()
    for engine in engines:
        engine.kill()
    server.runtime.store.check_integrity()
    server.stop(0)


def test_generate_streams_tokens_and_pins_the_next_turn(fleet):
    """Forwarding or pinning is broken if the second turn is not served on the first's rank."""
    server, stub, _engines, _ = fleet
    first = list(stub.Generate(turn("conv-a"), timeout=10))
    assert [list(r.chunk.token_ids) for r in first] == [[4], [5], [6]]
    assert first[0].placement == "new"
    assert first[-1].chunk.usage.completion_tokens == 3
    second = list(stub.Generate(turn("conv-a", tokens=(1, 2, 3, 6)), timeout=10))
    assert (second[0].rank_id, second[0].placement) == (first[0].rank_id, "pinned")
    assert {r: s.free for r, s in server.runtime.ranks().items()} == {"r0": 2, "r1": 2}


def test_child_samples_take_their_slots_on_the_engine(fleet):
    """A parent with children would be forwarded as one sample, or counted as one slot."""
    _server, stub, engines, _ = fleet
    responses = list(stub.Generate(turn("conv-c", max_tokens=1, child_samples=1), timeout=10))
    assert sorted(r.chunk.sample_index for r in responses) == [0, 1]
    assert max(engine.max_in_flight for engine in engines) == 2


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"conversation_id": "x", "max_tokens": 3}, "prompt"),
        ({"prompt_token_ids": common_pb2.TokenIds(ids=[]), "max_tokens": 3}, "prompt"),
        ({"prompt_text": "hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt_text": "hi", "max_tokens": 10**9}, "max_tokens"),
        ({"prompt_text": "hi", "max_tokens": 1, "rank_id": "nope"}, "rank_id"),
        ({"prompt_text": "hi", "max_tokens": 1, "child_samples": 2}, "child_samples"),
        (
            {"prompt_text": "hi", "max_tokens": 1, "sampling": common_pb2.SamplingParams(top_p=2)},
            "sampling.top_p",
        ),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(fleet, request_kwargs, field):
    """Bad input would be queued (and hang) or fail with a code the client cannot act on."""
    _server, stub, _engines, _ = fleet
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(router_pb2.GenerateRequest(**request_kwargs), timeout=5))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(field)


def test_explicit_rank_is_honoured(fleet):
    """The explicit rank field would be ignored if the request were placed by load."""
    _server, stub, _engines, _ = fleet
    responses = list(stub.Generate(turn("conv-e", rank_id="r1"), timeout=10))
    assert (responses[0].rank_id, responses[0].placement) == ("r1", "explicit")


def test_health_and_metrics_are_served(fleet):
    """Kubernetes probes and Prometheus scraping would fail without these endpoints."""
    server, stub, _engines, channel = fleet
    list(stub.Generate(turn("conv-m"), timeout=10))
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service="kvfleet.Router"), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    url = f"http://127.0.0.1:{server.serve_metrics(0, '127.0.0.1')}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    assert 'kvfleet_router_admissions_total{placement="new"} 1.0' in text
    for name in (
        "kvfleet_router_queue_depth",
        "kvfleet_router_deferrals_total",
        "kvfleet_router_deferrals_past_bound_total",
        "kvfleet_router_ttft_p90_seconds",
        "kvfleet_router_pinned_hits_total",
        "kvfleet_router_rank_free_slots",
        "kvfleet_router_redis_errors_total",
    ):
        assert name in text


def test_a_client_without_a_deadline_is_served(fleet):
    """Forwarding gRPC's "no deadline" (about 9.2e18 s) as a timeout fails every such call."""
    _server, stub, _engines, _ = fleet
    responses = list(stub.Generate(turn("conv-no-deadline")))
    assert responses[-1].chunk.finished


def test_a_handed_off_turn_without_a_client_deadline_is_served():
    """The generation half of a hand-off forwards the client's deadline too."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    engines = [
        FakeEngine("ctx", 2, role=common_pb2.RANK_ROLE_CONTEXT),
        FakeEngine("gen", 2, role=common_pb2.RANK_ROLE_GENERATION),
    ]
    for engine in engines:
        engine.join(f"127.0.0.1:{port}")
    wait_until(lambda: len(server.runtime.ranks()) == 2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        responses = list(router_pb2_grpc.RouterStub(channel).Generate(turn("conv-h")))
        assert [r.rank_id for r in responses][:2] == ["ctx", "gen"]
        assert responses[-1].chunk.finished
    finally:
        channel.close()
        for engine in engines:
            engine.kill()
        server.stop(0)


def test_metrics_listen_on_the_routers_address_only():
    """A router bound to loopback published /metrics on every interface (0.0.0.0)."""
    server, _port = create_server("127.0.0.1:0", RouterConfig(metrics_port=0))
    try:
        assert server._metrics_http.server_address[0] == "127.0.0.1"
    finally:
        server.stop(0)
