"""A hung router replica (SIGSTOP) must not take down the ranks that heartbeat to it.

Two router processes share a Redis of the test's own; two engine ranks (sim compute) are given
both replicas' rank ports and register with the first. While that replica is stopped, the ranks
dial the other, which keeps them and serves; streams on them through the live replica go on.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.router.redis_store import RedisStore
from router_fake_engine import wait_until
from router_process import TEST_FLEET_SECRET, start_router

pytestmark = pytest.mark.slow

PREFIX = "hung"
RANKS = ("rank-0", "rank-1")
HEARTBEAT_TIMEOUT_S = 4.0
STREAM_TOKENS = 300  # about 15 s at 50 ms a token: past the stop and the heartbeat timeout


@pytest.fixture
def routers(own_redis):
    flags = ("--heartbeat-timeout-seconds", str(HEARTBEAT_TIMEOUT_S), "--lease-seconds", "60")
    started = [start_router(own_redis.url, PREFIX, "--replica-id", name, *flags) for name in "ab"]
    yield started
    for router in started:
        router.process.send_signal(signal.SIGCONT)
        router.process.terminate()
        router.process.wait(timeout=30)


@pytest.fixture
def ranks(routers):
    """Ranks that know both replicas, the stopped one first."""
    both = ",".join(f"127.0.0.1:{router.rank_port}" for router in routers)
    config = EngineConfig(compute_backend="sim", sim_time_scale=25.0, max_batch_size=4)
    started = [
        EngineRank(
            config, RankAddresses(router=both, rank_id=rank_id, fleet_secret=TEST_FLEET_SECRET)
        )
        for rank_id in RANKS
    ]
    for rank in started:
        rank.start()
    yield started
    for rank in started:
        rank.stop(grace=0)


def generate(port: int, rank_id: str, max_tokens: int, started: threading.Event | None = None):
    """Tokens of one request placed on `rank_id` through the router on `port`."""
    request = router_pb2.GenerateRequest(
        conversation_id=f"{rank_id}-{max_tokens}-{time.monotonic_ns()}",
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3, 4]),
        max_tokens=max_tokens,
        rank_id=rank_id,
    )
    tokens = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for response in router_pb2_grpc.RouterStub(channel).Generate(request, timeout=120):
            tokens += response.chunk.token_ids
            if started is not None:
                started.set()
    return tokens


def test_ranks_of_a_hung_replica_stay_with_the_other(routers, ranks, own_redis):
    """Ranks heartbeating into the stopped replica would look silent to the other, which would
    remove them and cut every stream on them."""
    hung, live = routers
    store = RedisStore(own_redis.client(), PREFIX, owner="test")
    wait_until(lambda: set(store.snapshot()) == set(RANKS))
    assert {rank.link.router_address for rank in ranks} == {f"127.0.0.1:{hung.rank_port}"}
    outcomes: dict[str, object] = {}
    started = {rank_id: threading.Event() for rank_id in RANKS}

    def stream(rank_id: str) -> None:
        try:
            outcomes[rank_id] = len(generate(live.port, rank_id, STREAM_TOKENS, started[rank_id]))
        except grpc.RpcError as error:
            outcomes[rank_id] = error.code()

    workers = [threading.Thread(target=stream, args=(rank_id,)) for rank_id in RANKS]
    for worker in workers:
        worker.start()
    for event in started.values():
        assert event.wait(60)
    hung.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(3 * HEARTBEAT_TIMEOUT_S)  # the stop outlasts the live replica's timeout
        assert set(store.snapshot()) == set(RANKS)
        for rank_id in RANKS:
            assert len(generate(live.port, rank_id, 2)) == 2
        live_address = f"127.0.0.1:{live.rank_port}"
        assert all(rank.link.router_address == live_address for rank in ranks)
    finally:
        hung.process.send_signal(signal.SIGCONT)
    for worker in workers:
        worker.join(timeout=120)
    assert outcomes == dict.fromkeys(RANKS, STREAM_TOKENS)
    time.sleep(HEARTBEAT_TIMEOUT_S)  # the resumed replica must not sweep them either
    assert set(store.snapshot()) == set(RANKS)
    for rank_id in RANKS:
        assert len(generate(hung.port, rank_id, 2)) == 2
    store.client.close()
