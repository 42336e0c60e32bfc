"""Redis outages and the resync: a replica's stale view never makes a live rank look silent."""

from __future__ import annotations

import dataclasses
import time

import grpc
import redis
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.model import RankInfo, RankLoad
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.reservation_order import WritebackPlan
from kvfleet.services.router.server import RouterConfig, create_server
from kvfleet.services.router.store import RankRecord
from router_fake_engine import FakeEngine, wait_until

HEARTBEAT_TIMEOUT = 1.0
NOTHING_HELD = WritebackPlan(0, {}, frozenset())


def test_resync_never_writes_an_older_heartbeat_over_a_newer_one(own_redis):
    """A replica back from an outage would set a rank's heartbeat back to before the outage."""
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    store = RedisStore(client, prefix="newest", owner="a")
    info = RankInfo("r0", "127.0.0.1:1", 2)
    store.register_rank(info, 100.0)
    store.heartbeat("r0", RankLoad(free_slots=1), 200.0)
    stale = RankRecord(dataclasses.replace(info, address="127.0.0.1:9"), 150.0, RankLoad(2))
    store.resync({"r0": stale}, {}, NOTHING_HELD, 210.0)
    slots, last_heartbeat = store.snapshot()["r0"]
    assert (last_heartbeat, slots.info.address, slots.load.free_slots) == (200.0, info.address, 1)
    newer = RankRecord(dataclasses.replace(info, address="127.0.0.1:9"), 250.0, RankLoad(2))
    store.resync({"r0": newer}, {}, NOTHING_HELD, 260.0)
    slots, last_heartbeat = store.snapshot()["r0"]
    assert (last_heartbeat, slots.info.address) == (250.0, "127.0.0.1:9")
    client.close()


def test_replicas_back_one_after_the_other_remove_no_live_rank(own_redis):
    """The first replica back sees ranks that heartbeat to a replica still away as silent (its
    view is as old as the outage): sweeping them at once removes live ranks and their pins."""
    admission = AdmissionConfig(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT)
    common = dict(
        redis_url=own_redis.url,
        redis_prefix="resync",
        redis_timeout_seconds=0.3,
        resync_grace_seconds=60.0,  # far longer than the test takes to bring the late one back
    )
    first = RouterConfig(admission=admission, redis_retry_seconds=0.1, **common)
    late = RouterConfig(admission=admission, redis_retry_seconds=3600.0, **common)
    routers = [create_server("127.0.0.1:0", first), create_server("127.0.0.1:0", late)]
    servers = [server for server, _ in routers]
    engines = [FakeEngine("r0", 2), FakeEngine("r1", 2)]
    for engine, (_server, port) in zip(engines, routers, strict=True):
        engine.join(f"127.0.0.1:{port}")
    wait_until(lambda: all(len(s.runtime.ranks()) == 2 for s in servers))
    channel = grpc.insecure_channel(f"127.0.0.1:{routers[0][1]}")
    try:
        request = router_pb2.GenerateRequest(
            conversation_id="conv-keep",
            prompt_token_ids=common_pb2.TokenIds(ids=[1]),
            max_tokens=1,
            rank_id="r1",
        )
        list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=10))
        own_redis.stop()
        wait_until(lambda: all(s.runtime.degraded for s in servers))
        # The late replica has made its first (failed) recovery try; the next is an hour away.
        wait_until(lambda: servers[1].runtime.last_housekeeping_at > time.time() - 60)

        def stale(server, rank_id: str) -> bool:
            record = server.runtime.store.local.ranks()[rank_id]
            return time.time() - record.last_heartbeat > 2 * HEARTBEAT_TIMEOUT

        wait_until(lambda: stale(servers[0], "r1") and stale(servers[1], "r0"))
        own_redis.start()
        wait_until(lambda: not servers[0].runtime.degraded)
        back = servers[0].runtime.store.recovered_at
        wait_until(lambda: servers[0].runtime.last_housekeeping_at > back + 0.2)
        assert servers[0].metrics.ranks_removed._value.get() == 0
        assert servers[1].runtime.store.try_recover(time.time())  # the late replica is back
        client = own_redis.client()
        wait_until(lambda: sorted(client.hkeys("resync:ranks")) == ["r0", "r1"])
        late_back = servers[1].runtime.store.recovered_at
        # Both ranks are heard again after the late replica's resync; nothing was removed.
        wait_until(
            lambda: all(
                last > late_back
                for _slots, last in servers[0].runtime.store.remote.snapshot().values()
            )
        )
        assert [s.metrics.ranks_removed._value.get() for s in servers] == [0, 0]
        assert client.get("resync:pin:conv-keep") == "r1"
        client.close()
    finally:
        channel.close()
        for engine in engines:
            engine.kill()
        for server in servers:
            server.stop(0)
