"""Two router processes on one Redis under concurrent load."""

from __future__ import annotations

import itertools
import threading

import grpc
import pytest
import redis
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.redis_store import RedisStore
from router_fake_engine import SHARED_REDIS_URL, FakeEngine, wait_until
from router_process import TEST_FLEET_SECRET, RouterProcess
from router_process import start_router as start_process

CONVERSATIONS = 12
TURNS = 3


def start_router(prefix: str) -> RouterProcess:
    wait = ("--max-wait-passes", "1000", "--max-wait-seconds", "30")
    return start_process(SHARED_REDIS_URL, prefix, *wait)


@pytest.fixture
def two_routers(redis_prefix):
    started = [start_router(redis_prefix), start_router(redis_prefix)]
    yield started
    for router in started:
        router.process.terminate()
        router.process.wait(timeout=30)


def test_two_routers_never_exceed_capacity_and_agree_on_pins(two_routers, redis_store):
    """Non-atomic admission would over-fill a rank; replicas with own pins would split turns."""
    ports = [router.port for router in two_routers]
    engines = [FakeEngine(f"r{i}", 2, delay=0.005) for i in range(3)]
    for i, engine in enumerate(engines):
        engine.join(f"127.0.0.1:{two_routers[i % 2].rank_port}", secret=TEST_FLEET_SECRET)
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port in ports]
    stubs = [router_pb2_grpc.RouterStub(channel) for channel in channels]
    store = RedisStore(
        redis.Redis.from_url(SHARED_REDIS_URL, decode_responses=True), prefix=redis_store.prefix
    )
    wait_until(lambda: len(store.snapshot()) == 3)
    served: dict[str, list[router_pb2.GenerateResponse]] = {}
    errors: list[Exception] = []

    def conversation(name: str) -> None:
        try:
            for t in range(TURNS):
                request = router_pb2.GenerateRequest(
                    conversation_id=name,
                    prompt_token_ids=common_pb2.TokenIds(ids=[1, t]),
                    max_tokens=4,
                )
                responses = list(stubs[t % 2].Generate(request, timeout=30))
                served.setdefault(name, []).append(responses[0])
        except Exception as error:  # reported below, with the conversation
            errors.append(error)

    workers = [threading.Thread(target=conversation, args=(f"c{i}",)) for i in range(CONVERSATIONS)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert errors == []
        assert max(engine.max_in_flight for engine in engines) <= 2
        for turns in served.values():
            assert len(turns) == TURNS
            for previous, current in itertools.pairwise(turns):
                assert current.placement == "pinned"
                assert current.rank_id == previous.rank_id
        pins = store.get_pins(served, 0)
        assert pins == {name: turns[-1].rank_id for name, turns in served.items()}
        wait_until(lambda: all(s.used == 0 for s, _ in store.snapshot().values()))
        store.check_integrity()
    finally:
        for channel in channels:
            channel.close()
        for engine in engines:
            engine.kill()
