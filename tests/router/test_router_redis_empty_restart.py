"""Redis restarted empty under two router replicas: no rank over-filled, no conversation split.

Two router processes share a Redis of the test's own (no persistence) and two fake ranks of two
slots. Long streams through both replicas fill every slot; Redis is restarted empty under them;
then the next turn of every conversation comes in through both replicas. Each replica finds its
lease gone, admits nothing until it and the other wrote their ranks, pins and reservations back
(with their leases, so the first back reaps nothing of the other's), and the turns land on
their pinned ranks once the long streams give the slots back.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.redis_store import RedisStore
from router_fake_engine import FakeEngine, wait_until
from router_process import TEST_FLEET_SECRET, start_router

pytestmark = pytest.mark.slow

PREFIX = "restart"
SLOTS = 2
CONVERSATIONS = 8
LONG_TOKENS = 60  # 3 s at 50 ms a token: running across the restart


@pytest.fixture
def routers(own_redis):
    flags = ("--lease-seconds", "3", "--heartbeat-timeout-seconds", "5")
    flags += ("--max-wait-passes", "100000", "--max-wait-seconds", "60")
    started = [start_router(own_redis.url, PREFIX, "--replica-id", name, *flags) for name in "ab"]
    yield started
    for router in started:
        router.process.terminate()
        router.process.wait(timeout=30)


@pytest.fixture
def engines(routers):
    started = [FakeEngine(f"r{i}", SLOTS, delay=0.05) for i in range(2)]
    for engine, router in zip(started, routers, strict=True):
        engine.join(f"127.0.0.1:{router.rank_port}", secret=TEST_FLEET_SECRET)
    yield started
    for engine in started:
        engine.kill()


def wait_for_beats(client) -> None:
    """Until each replica renewed its lease once after both held one (each knows the other:
    a replica waits, after an outage, only for the replicas it knew)."""
    keys = [f"{PREFIX}:replica:{name}" for name in "ab"]
    wait_until(lambda: all(client.exists(key) for key in keys))
    first = {key: client.pttl(key) for key in keys}
    wait_until(lambda: all(client.pttl(key) > first[key] for key in keys))


def turn(stub, conversation: str, max_tokens: int, started=None, **fields) -> str:
    """The rank that served one turn (its tokens all received)."""
    request = router_pb2.GenerateRequest(
        conversation_id=conversation,
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2]),
        max_tokens=max_tokens,
        **fields,
    )
    rank_id, tokens = "", 0
    for response in stub.Generate(request, timeout=120):
        rank_id = response.rank_id or rank_id
        tokens += len(response.chunk.token_ids)
        if started is not None:
            started.set()
    assert tokens == max_tokens
    return rank_id


def test_an_empty_restart_over_admits_nothing_and_splits_no_conversation(
    routers, engines, own_redis
):
    """A replica reaping the other's re-written reservations, or admitting before both wrote
    theirs back, over-fills a rank; one reading the emptied pins moves conversations."""
    channels = [grpc.insecure_channel(f"127.0.0.1:{router.port}") for router in routers]
    stubs = [router_pb2_grpc.RouterStub(channel) for channel in channels]
    store = RedisStore(own_redis.client(), PREFIX, owner="test")
    try:
        wait_until(lambda: len(store.snapshot()) == 2)
        wait_for_beats(store.client)
        homes = {f"c{i}": f"r{i % 2}" for i in range(CONVERSATIONS)}
        for i, (conversation, home) in enumerate(homes.items()):  # pinned there
            assert turn(stubs[i // 2 % 2], conversation, 2, rank_id=home) == home
        errors: list[Exception] = []
        started = [threading.Event() for _ in range(2 * SLOTS)]

        def long_stream(index: int) -> None:
            try:
                turn(stubs[index % 2], f"long-{index}", LONG_TOKENS, started[index])
            except Exception as error:  # reported below
                errors.append(error)

        longs = [threading.Thread(target=long_stream, args=(i,)) for i in range(2 * SLOTS)]
        for worker in longs:
            worker.start()
        for event in started:
            assert event.wait(60)
        assert [engine.in_flight for engine in engines] == [SLOTS, SLOTS]
        own_redis.stop()
        own_redis.start()  # empty: --save "" and no append-only file
        placed: dict[str, str] = {}

        def next_turn(index: int) -> None:
            try:
                placed[f"c{index}"] = turn(stubs[(index + 1) % 2], f"c{index}", 2)
            except Exception as error:  # reported below
                errors.append(error)

        turns = [threading.Thread(target=next_turn, args=(i,)) for i in range(CONVERSATIONS)]
        for worker in turns:
            worker.start()
        for worker in longs + turns:
            worker.join(timeout=120)
        assert errors == []
        assert max(engine.max_in_flight for engine in engines) <= SLOTS
        assert placed == homes
        wait_until(lambda: all(s.used == 0 for s, _ in store.snapshot().values()))
        store.check_integrity()
    finally:
        for channel in channels:
            channel.close()
        store.client.close()
