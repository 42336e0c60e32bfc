"""An engine's error for one request: passed on, never taken for a dead rank, never retried."""

from __future__ import annotations

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until

REQUEST_LEVEL_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INTERNAL,
)


def turn(conversation, max_tokens=3, temperature=0.0, top_p=1.0, **kwargs):
    return router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        sampling=common_pb2.SamplingParams(temperature=temperature, top_p=top_p),
        max_tokens=max_tokens,
        **kwargs,
    )


@pytest.fixture
def fleet():
    server, port = create_server("127.0.0.1:0", RouterConfig())
    engines = [FakeEngine("r0", 2), FakeEngine("r1", 2)]
    for engine in engines:
        engine.join(f"127.0.0.1:{port}")
    wait_until(lambda: len(server.runtime.ranks()) == 2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield server, router_pb2_grpc.RouterStub(channel), engines
    channel.close()
    for engine in engines:
        engine.kill()
    server.runtime.store.check_integrity()
    server.stop(0)


@pytest.mark.parametrize("code", REQUEST_LEVEL_CODES, ids=lambda code: code.name)
def test_a_request_level_error_keeps_the_rank_and_is_not_retried(fleet, code):
    """Taking a request's error for a dead rank removes healthy ranks and fans one bad request
    out over the fleet."""
    server, stub, (r0, r1) = fleet
    list(stub.Generate(turn("conv-e", max_tokens=1, rank_id="r0"), timeout=10))
    r0.fail_with = code
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(turn("conv-e"), timeout=10))
    assert caught.value.code() == code
    assert "r0" in caught.value.details()
    assert set(server.runtime.ranks()) == {"r0", "r1"}
    assert (r0.generate_calls, r1.generate_calls) == (2, 0)
    assert server.metrics.ranks_removed._value.get() == 0
    assert server.metrics.retries._value.get() == 0
    r0.fail_with = None
    again = list(stub.Generate(turn("conv-e"), timeout=10))
    assert (again[0].rank_id, again[0].placement) == ("r0", "pinned")


def test_a_full_rank_keeps_its_place_and_the_request_is_requeued(fleet):
    """RESOURCE_EXHAUSTED from a rank would fail the client, or remove a rank that is busy."""
    server, stub, (r0, _r1) = fleet
    list(stub.Generate(turn("conv-f", max_tokens=1, rank_id="r0"), timeout=10))
    r0.fail_with, r0.fail_times = grpc.StatusCode.RESOURCE_EXHAUSTED, 3
    responses = list(stub.Generate(turn("conv-f"), timeout=20))
    assert responses[-1].chunk.finished
    assert server.metrics.requeued_full._value.get() == 3
    assert set(server.runtime.ranks()) == {"r0", "r1"}
    assert server.metrics.ranks_removed._value.get() == 0


def test_a_sampler_failure_on_a_real_engine_removes_no_rank():
    """A tiny temperature or top_p (accepted values) must not make the router drop ranks: the
    request succeeds or fails alone with a request-level status, and every rank stays."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    config = EngineConfig(model="tiny", max_batch_size=4, page_size=16, kv_pages=64)
    address = f"127.0.0.1:{port}"
    ranks = [
        EngineRank(config, RankAddresses(router=address, rank_id=f"rank-{i}")).start()
        for i in range(2)
    ]
    channel = grpc.insecure_channel(address)
    stub = router_pb2_grpc.RouterStub(channel)
    try:
        for rank in ranks:
            assert rank.link.registered.wait(30)
        for sampling in ({"temperature": 1e-40}, {"temperature": 1.0, "top_p": 1e-40}):
            try:
                list(stub.Generate(turn("conv-nan", max_tokens=4, **sampling), timeout=60))
            except grpc.RpcError as error:
                assert error.code() != grpc.StatusCode.UNAVAILABLE, error.details()
            assert set(server.runtime.ranks()) == {"rank-0", "rank-1"}
            assert server.metrics.ranks_removed._value.get() == 0
            assert server.metrics.retries._value.get() == 0
        good = list(stub.Generate(turn("conv-good", max_tokens=2), timeout=60))
        assert good[-1].chunk.finished
    finally:
        channel.close()
        for rank in ranks:
            rank.stop(grace=0.5)
        server.stop(0)
