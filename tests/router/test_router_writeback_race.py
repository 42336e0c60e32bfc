"""Two replicas on one Redis: a replica writing its reservations back from its mirror (its
lease lapsed and the other replica reaped them) never brings back one it released meanwhile."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.router.failover_store import FailoverStore
from kvfleet.services.router.model import RankInfo
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.replica_lease import ReplicaLease
from own_redis import OwnRedis

RANK = "r0"
SLOTS = 8
NOW = 1000.0


@pytest.fixture(scope="module")
def server():
    """One redis-server for the module (each example keeps to a prefix of its own)."""
    instance = OwnRedis()
    instance.start()
    yield instance
    instance.stop()


class Replica:
    """A router replica's store and lease on a prefix; its lease beats only when told."""

    def __init__(self, server: OwnRedis, prefix: str, owner: str) -> None:
        self.client = server.client()
        self.prefix, self.owner = prefix, owner
        self.store = FailoverStore(RedisStore(self.client, prefix, owner), pin_ttl_seconds=60)
        self.lease = ReplicaLease(self.store, lease_seconds=60)
        self.store.remote.renew_lease(60)
        self.plans = []

    def admit(self, request_id: str) -> bool:
        """False when refused (degraded: while its lease is gone it admits nothing)."""
        return self.store.try_admit(RANK, request_id, 1, "", 60, NOW)

    def held(self) -> set[str]:
        return set(self.store.local.reservations().get(RANK, {}))

    def in_redis(self) -> set[str]:
        fields = self.client.hkeys(f"{self.prefix}:res:{RANK}")
        return {f.split("|", 1)[1] for f in fields if f.startswith(f"{self.owner}|")}

    def lapse(self) -> None:
        """Its lease runs out (a stalled or cut-off replica)."""
        self.client.delete(f"{self.prefix}:replica:{self.owner}")


@pytest.fixture
def pair(server):
    prefix = f"race-{uuid.uuid4().hex[:8]}"
    replicas = [Replica(server, prefix, owner) for owner in ("a", "b")]
    for replica in replicas:  # each mirror learns of the rank
        replica.store.register_rank(RankInfo(RANK, "127.0.0.1:1", SLOTS), NOW)
    yield replicas
    for replica in replicas:
        replica.client.close()


def test_a_release_between_snapshot_and_write_back_stays_released(pair):
    """The write-back would put the released reservation back, and no one would release it."""
    a, b = pair
    assert a.admit("x1") and a.admit("x2") and b.admit("y1")
    a.lapse()
    b.lease.beat()  # b reaps a's reservations
    assert a.in_redis() == set()
    stale = a.store.writeback_plan()
    a.store.release(RANK, "x1")
    assert a.store.remote.write_back(stale) is False  # refused: x1 was released since
    assert a.in_redis() == set()
    a.lease.beat()  # the lease is gone: a serves from its mirror until it wrote it back
    assert a.store.degraded
    assert a.store.try_recover(NOW)  # a fresh snapshot goes back, with the lease
    assert a.in_redis() == {"x2"}
    a.store.release(RANK, "x2")
    b.store.release(RANK, "y1")
    assert a.store.remote.snapshot()[RANK][0].used == 0


STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["admit", "release"]), st.integers(0, 1), st.integers(0, 2)),
        st.tuples(st.sampled_from(["lapse", "beat", "recover"]), st.integers(0, 1)),
    ),
    max_size=12,
)


def run(replicas: list[Replica], steps) -> None:
    """Apply the steps, checking after each that no replica serving from Redis has a
    reservation there that it does not hold (a degraded one's releases wait for its recovery)."""
    for kind, index, *request in steps:
        replica = replicas[index]
        request_id = f"q{request[0]}" if request else ""
        if kind == "admit" and request_id not in replica.held():
            replica.admit(request_id)
        elif kind == "release" and request_id in replica.held():
            replica.store.release(RANK, request_id)
        elif kind == "lapse":
            replica.lapse()
        elif kind == "beat":
            replica.lease.beat()
        elif kind == "recover":
            replica.store.try_recover(NOW)
        for each in replicas:
            if not each.store.degraded:
                assert each.in_redis() <= each.held(), f"{each.owner} leaked after {kind}"


# Enough examples to reach orderings of three steps around the late write-back (80 missed one
# that 300 found); about 5 s.
@settings(max_examples=400, deadline=None)
@given(
    held=st.sets(st.integers(0, 2), min_size=1),
    before=STEPS,
    between=STEPS,
    after=STEPS,
    writer=st.integers(0, 1),
)
def test_no_interleaving_of_two_replicas_leaks_a_reservation(
    server, held, before, between, after, writer
):
    """A reservation in Redis that its replica no longer holds would take a slot for good."""
    prefix = f"race-{uuid.uuid4().hex[:8]}"
    replicas = [Replica(server, prefix, owner) for owner in ("a", "b")]
    for replica in replicas:
        replica.store.register_rank(RankInfo(RANK, "127.0.0.1:1", SLOTS), NOW)
    try:
        run(replicas, [("admit", writer, request) for request in sorted(held)] + before)
        plan = replicas[writer].store.writeback_plan()
        run(replicas, between)
        replicas[writer].store.remote.write_back(plan)  # the write-back of a snapshot, late
        run(replicas, [("check", writer), ("beat", writer), *after])
        # Each finds out its lease is gone, then both recover (the first back waits for the
        # other to write its state back: a second round).
        run(replicas, [("beat", 0), ("beat", 1), *[("recover", 0), ("recover", 1)] * 2])
        assert not any(replica.store.degraded for replica in replicas)
        for replica in replicas:
            for request_id in replica.held():
                replica.store.release(RANK, request_id)
            replica.lease.beat()
        assert replicas[0].store.remote.snapshot()[RANK][0].used == 0
        replicas[0].store.check_integrity()
    finally:
        replicas[0].store.remote.clear()
        for replica in replicas:
            replica.client.close()
