"""Reservation leases: a SIGKILLed replica's slots come back; a restart clears its old ones."""

from __future__ import annotations

import signal
import threading

import grpc
import pytest
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.server import RouterConfig, create_server
from router_fake_engine import FakeEngine, wait_until
from router_process import start_router

PREFIX = "lease"
SLOTS = 4  # per rank, two ranks


@pytest.fixture
def fleet(own_redis):
    """A replica in-process (the survivor) and two slow fake ranks registered through it."""
    config = RouterConfig(redis_url=own_redis.url, redis_prefix=PREFIX, lease_seconds=2.0)
    server, port = create_server("127.0.0.1:0", config)
    engines = [FakeEngine(f"r{i}", SLOTS, delay=0.2) for i in range(2)]
    for engine in engines:
        engine.join(f"127.0.0.1:{port}")
    store = RedisStore(own_redis.client(), prefix=PREFIX, owner="test")
    wait_until(lambda: len(store.snapshot()) == 2)
    yield server, port, engines, store
    for engine in engines:
        engine.kill()
    server.stop(0)
    store.client.close()


def used(store: RedisStore) -> int:
    return sum(slots.used for slots, _ in store.snapshot().values())


def fill_through(port: int) -> list[threading.Thread]:
    """Long streams through the router on `port` until every slot of the fleet is reserved."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = router_pb2_grpc.RouterStub(channel)

    def stream(i: int) -> None:
        request = router_pb2.GenerateRequest(
            conversation_id=f"conv-{i}",
            prompt_token_ids=common_pb2.TokenIds(ids=[1]),
            max_tokens=10_000,
        )
        try:
            for _ in stub.Generate(request, timeout=120):
                pass
        except grpc.RpcError:
            pass  # the replica was killed under it

    workers = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(2 * SLOTS)]
    for worker in workers:
        worker.start()
    return workers


def serve_one(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = router_pb2.GenerateRequest(
            conversation_id="conv-after",
            prompt_token_ids=common_pb2.TokenIds(ids=[1]),
            max_tokens=1,
        )
        responses = list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=30))
        assert responses[-1].chunk.finished


def test_a_killed_replicas_slots_come_back_within_its_lease(fleet, own_redis):
    """Reservations without a lease stay in Redis for ever once their replica is SIGKILLed."""
    server, port, engines, store = fleet
    started = start_router(own_redis.url, PREFIX, "--replica-id", "victim", "--lease-seconds", "2")
    victim, victim_port = started.process, started.port
    try:
        workers = fill_through(victim_port)
        wait_until(lambda: used(store) == 2 * SLOTS)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        # At least the victim's: on a loaded machine its 2 s lease can also lapse once while it
        # still runs (then it takes its reservations again), and those count too. The reaper
        # counts after Redis has dropped them, so wait for both.
        wait_until(lambda: used(store) == 0 and server.lease.reaped >= 2 * SLOTS)
        for engine in engines:
            engine.delay = 0.0
        serve_one(port)
        for worker in workers:
            worker.join(timeout=30)
    finally:
        victim.kill()
        victim.wait(timeout=10)


def test_a_restart_under_the_same_id_clears_its_old_reservations(fleet, own_redis):
    """A pod restarted under its name would find its dead run's reservations still counted."""
    _server, _port, _engines, store = fleet
    lease = ("--replica-id", "pod-a", "--lease-seconds", "600")  # the lease alone cannot help
    started = start_router(own_redis.url, PREFIX, *lease)
    first, first_port = started.process, started.port
    second = None
    try:
        workers = fill_through(first_port)
        wait_until(lambda: used(store) == 2 * SLOTS)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert used(store) == 2 * SLOTS
        second = start_router(own_redis.url, PREFIX, *lease).process
        wait_until(lambda: used(store) == 0)
        for worker in workers:
            worker.join(timeout=30)
    finally:
        first.kill()
        first.wait(timeout=10)
        if second is not None:  # cleanup only: this test is not about a graceful stop
            second.kill()
            second.wait(timeout=30)
