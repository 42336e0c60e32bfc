"""gRPC Generate through a real router to two real engine ranks; KV events; bad input."""

from __future__ import annotations

import grpc
import pytest
from engine_testkit import TEST_CONFIG, wait_until
from kvfleet.proto import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.server import RouterConfig, create_server


@pytest.fixture(scope="module")
def fleet():
    router, port = create_server("127.0.0.1:0", RouterConfig())
    address = f"127.0.0.1:{port}"
    ranks = [
        EngineRank(TEST_CONFIG, RankAddresses(router=address, rank_id=f"rank-{i}")).start()
        for i in range(2)
    ]
    for rank in ranks:
        assert rank.link.registered.wait(10)
    channel = grpc.insecure_channel(address)
    yield router, ranks, router_pb2_grpc.RouterStub(channel)
    channel.close()
    for rank in ranks:
        rank.core.check_integrity()
        rank.stop(grace=0.5)
    router.stop(grace=0.5)


def _generate(stub, conversation: str, prompt: list[int], max_tokens: int = 6):
    request = router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=prompt),
        sampling=common_pb2.SamplingParams(temperature=0.0),
        max_tokens=max_tokens,
    )
    responses = list(stub.Generate(request, timeout=30))
    tokens = [t for r in responses for t in r.chunk.token_ids]
    return responses[0].rank_id, tokens, responses[-1].chunk


def test_second_turn_lands_on_the_same_rank_and_reuses_its_prefix(fleet):
    """A turn sent away from its prefix, or not reusing it, loses the point of the fleet."""
    _router, _ranks, stub = fleet
    prompt = list(range(1, 120))
    rank, output, last = _generate(stub, "conv-a", prompt)
    assert (len(output), last.finished, last.usage.cached_tokens) == (6, True, 0)
    rank2, _, last2 = _generate(stub, "conv-a", prompt + output + [7, 8, 9])
    assert rank2 == rank
    assert last2.usage.prompt_tokens == 128 and last2.usage.cached_tokens == 112
    assert last2.usage.ttft_seconds > 0


def test_kv_events_reach_the_router_prefix_index(fleet):
    """Without KV events the router cannot place new conversations by prefix overlap."""
    router, _ranks, stub = fleet
    rank, _, _ = _generate(stub, "conv-b", list(range(3, 70)))

    def indexed() -> int:
        return router.runtime.with_prefix_index(lambda index: index.block_count(rank))

    wait_until(lambda: indexed() >= 4)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt_token_ids": common_pb2.TokenIds(ids=[1] * 5000)}, "prompt"),
        ({"sampling": common_pb2.SamplingParams(temperature=-1)}, "sampling.temperature"),
        ({"sampling": common_pb2.SamplingParams(top_p=1.5)}, "sampling.top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"sampling": common_pb2.SamplingParams(grammar="start: (")}, "sampling.grammar"),
    ],
)
def test_engine_rejects_bad_input_with_invalid_argument_naming_the_field(fleet, change, field):
    """A bad request that is not INVALID_ARGUMENT would make the router retry other ranks."""
    _router, ranks, _stub = fleet
    request = engine_pb2.EngineGenerateRequest(
        request_id="bad", prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]), max_tokens=4
    )
    for name, value in change.items():
        if isinstance(value, int):
            setattr(request, name, value)
        else:
            getattr(request, name).CopyFrom(value)
    with (
        grpc.insecure_channel(f"127.0.0.1:{ranks[0].grpc_port}") as channel,
        pytest.raises(grpc.RpcError) as error,
    ):
        list(engine_pb2_grpc.EngineStub(channel).Generate(request, timeout=10))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}: ")


def test_a_rank_takes_as_many_streams_as_it_has_slots():
    """If this fails, the rank's gRPC pool has fewer threads than its slots: each stream holds
    one, so the requests past the pool wait unsubmitted and the batch never fills."""
    slots = 80  # more than any fixed pool of 64
    # A slowed simulated accelerator keeps every request running while the test looks.
    config = TEST_CONFIG.with_changes(
        compute_backend="sim", sim_time_scale=10.0, max_batch_size=slots
    )
    rank = EngineRank(config, RankAddresses(rank_id="wide")).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{rank.grpc_port}")
    stub = engine_pb2_grpc.EngineStub(channel)
    calls = [
        stub.Generate(
            engine_pb2.EngineGenerateRequest(
                request_id=f"wide-{i}",
                prompt_token_ids=common_pb2.TokenIds(ids=[1 + i, 2, 3, 4]),
                sampling=common_pb2.SamplingParams(temperature=0.0),
                max_tokens=500,
            ),
            timeout=120,
        )
        for i in range(slots)
    ]
    try:
        # Every request reached the core (running, or waiting there for pages).
        wait_until(lambda: rank.core.load().running + rank.core.load().queued == slots)
    finally:
        for call in calls:
            call.cancel()
        channel.close()
        rank.stop(grace=0.5)
