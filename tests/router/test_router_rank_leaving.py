"""A rank shutting down (SIGTERM drain) under a real router: its streams finish whole.

A router process and two engine ranks (sim compute, in-process). Rank 0 runs a long stream and
holds a pinned conversation when it starts to leave: the router places nothing new there, the
pinned conversation's next turn moves to rank 1, a call that reaches rank 0 after it stopped
taking calls is retried elsewhere without cancelling the stream, and the drain ends once the
stream has finished, not at an idle moment before.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.redis_store import RedisStore
from router_fake_engine import wait_until
from router_process import TEST_FLEET_SECRET, start_router

pytestmark = pytest.mark.slow

PREFIX = "leaving"
STREAM_TOKENS = 120  # about 6 s at 50 ms a token


@pytest.fixture
def router(own_redis):
    started = start_router(own_redis.url, PREFIX, "--heartbeat-timeout-seconds", "4")
    yield started
    started.process.terminate()
    started.process.wait(timeout=30)


@pytest.fixture
def ranks(router):
    config = EngineConfig(compute_backend="sim", sim_time_scale=25.0, max_batch_size=4)
    address = f"127.0.0.1:{router.rank_port}"
    started = [
        EngineRank(
            config,
            RankAddresses(router=address, rank_id=f"rank-{i}", fleet_secret=TEST_FLEET_SECRET),
        ).start()
        for i in range(2)
    ]
    yield started
    for rank in started:
        rank.stop(grace=0)


def generate(port: int, conversation: str, max_tokens: int, started=None, **fields):
    """(rank id, tokens) of one request through the router on `port`."""
    request = router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3, 4]),
        max_tokens=max_tokens,
        **fields,
    )
    rank_id, tokens = "", []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for response in router_pb2_grpc.RouterStub(channel).Generate(request, timeout=120):
            rank_id = response.rank_id or rank_id
            tokens += response.chunk.token_ids
            if started is not None:
                started.set()
    return rank_id, tokens


def test_a_leaving_rank_finishes_its_stream_and_hands_its_pins_on(router, ranks, own_redis):
    """The drain would end at an idle moment, serve pinned turns to the last, or have the
    router cancel the stream when a call to the leaving rank is refused."""
    leaving = ranks[0]
    store = RedisStore(own_redis.client(), PREFIX, owner="test")
    wait_until(lambda: set(store.snapshot()) == {"rank-0", "rank-1"})
    assert generate(router.port, "pinned", 2, rank_id="rank-0")[0] == "rank-0"
    outcome: dict[str, object] = {}
    started = threading.Event()

    def stream() -> None:
        try:
            outcome["stream"] = generate(
                router.port, "long", STREAM_TOKENS, started, rank_id="rank-0"
            )
        except grpc.RpcError as error:
            outcome["stream"] = error.code()

    worker = threading.Thread(target=stream)
    worker.start()
    assert started.wait(60)
    drain = threading.Thread(target=leaving.drain_and_stop, args=(120.0,))
    drain.start()
    try:
        assert leaving.link.leaving_heard.wait(30)
        assert store.snapshot()["rank-0"][0].load.leaving
        assert generate(router.port, "pinned", 2)[0] == "rank-1"  # the pin moved
        assert generate(router.port, "new", 2)[0] == "rank-1"
        # Refused by the leaving rank (it takes no new call), retried on the other.
        assert generate(router.port, "asks-0", 2, rank_id="rank-0", relax_rank=True)[0] == "rank-1"
    finally:
        worker.join(timeout=120)
        drain.join(timeout=120)
    assert isinstance(outcome["stream"], tuple), outcome["stream"]  # not cut: whole
    rank_id, tokens = outcome["stream"]
    assert (rank_id, len(tokens)) == ("rank-0", STREAM_TOKENS)
    assert not drain.is_alive()
    store.client.close()
