"""Scale-in drain: a draining rank keeps its pinned turns but gets no new placements.

On the in-process and the Redis store (the flag travels in the heartbeat record), then over
gRPC from a heartbeat to a placement.
"""

from __future__ import annotations

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo, RankLoad
from kvfleet.services.router.server import RouterConfig, create_server
from kvfleet.services.router.store import LocalStore
from router_fake_engine import FakeEngine, wait_until


def frozen_clock() -> float:
    """A clock that never moves (the property test decides within one instant)."""
    return 1000.0


def make_queue(store, clock, ranks, affinity="strict", passes=1):
    for rank_id, capacity in ranks:
        store.register_rank(RankInfo(rank_id, f"{rank_id}:1", capacity), clock())
    config = AdmissionConfig(affinity=affinity, max_wait_passes=passes, max_wait_seconds=60)
    return AdmissionQueue(store, config, clock)


def drain(store, clock, rank_id, draining=True, free=1):
    """Report a heartbeat with the drain flag, as a leaving pod's rank does."""
    assert store.heartbeat(rank_id, RankLoad(free, 0, 0.0, draining), clock())


def request(clock, request_id, conversation="", **kwargs):
    return PendingRequest(request_id, conversation, clock(), **kwargs)


def placements(result):
    return [(a.request.request_id, a.rank.rank_id, a.placement) for a in result.admitted]


def pin(queue, clock, conversation, rank_id):
    """Pin a conversation by serving a first turn on `rank_id`, then finishing it."""
    queue.enqueue(request(clock, f"{conversation}-t0", conversation, explicit_rank=rank_id))
    [admission] = queue.run_pass().admitted
    queue.store.release(rank_id, admission.request.request_id)


def test_heartbeat_flag_is_kept_by_the_store(store, clock):
    """The router would never see a drain if the store dropped the heartbeat's flag."""
    make_queue(store, clock, [("a", 2)])
    drain(store, clock, "a")
    [(slots, _)] = store.snapshot().values()
    assert slots.load == RankLoad(1, 0, 0.0, True)


def test_new_conversation_avoids_a_draining_rank(store, clock):
    """Scale-in would strand new conversations on a leaving pod if placement ignored the flag."""
    queue = make_queue(store, clock, [("a", 4), ("b", 1)])
    drain(store, clock, "a")
    queue.enqueue(request(clock, "n1", "new-conv"))
    assert placements(queue.run_pass()) == [("n1", "b", Placement.NEW)]
    store.check_integrity()


def test_pinned_turn_is_still_served_on_its_draining_home(store, clock):
    """Draining would throw away retained prefixes if pinned turns were moved at once."""
    queue = make_queue(store, clock, [("a", 1), ("b", 1)])
    pin(queue, clock, "c1", "a")
    drain(store, clock, "a")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    assert placements(queue.run_pass()) == [("c1-t1", "a", Placement.PINNED)]
    store.check_integrity()


def test_fallback_after_the_bound_avoids_a_draining_rank(store, clock):
    """A turn released by the deferral bound must not be re-pinned onto a leaving rank."""
    queue = make_queue(store, clock, [("a", 1), ("b", 1), ("c", 1)], passes=1)
    pin(queue, clock, "c1", "a")
    drain(store, clock, "b")  # b sorts first among equally free ranks: only the flag skips it
    queue.enqueue(request(clock, "filler", explicit_rank="a"))
    queue.run_pass()
    queue.enqueue(request(clock, "c1-t1", "c1"))
    assert queue.run_pass().deferrals == 1
    assert placements(queue.run_pass()) == [("c1-t1", "c", Placement.FALLBACK)]
    assert store.get_pins(["c1"], clock()) == {"c1": "c"}
    store.check_integrity()


def test_lenient_away_placement_avoids_a_draining_rank(store, clock):
    """Lenient affinity would send a full home's turn to a leaving rank."""
    queue = make_queue(store, clock, [("a", 1), ("b", 1), ("c", 1)], affinity="lenient")
    pin(queue, clock, "c1", "a")
    drain(store, clock, "b")
    queue.enqueue(request(clock, "filler", explicit_rank="a"))
    queue.run_pass()
    queue.enqueue(request(clock, "c1-t1", "c1"))
    assert placements(queue.run_pass()) == [("c1-t1", "c", Placement.AWAY)]
    store.check_integrity()


def test_explicit_rank_is_served_even_while_draining(store, clock):
    """A client that names a rank must still reach it until the rank leaves."""
    queue = make_queue(store, clock, [("a", 1), ("b", 1)])
    drain(store, clock, "a")
    queue.enqueue(request(clock, "e1", explicit_rank="a"))
    assert placements(queue.run_pass()) == [("e1", "a", Placement.EXPLICIT)]
    store.check_integrity()


def test_relaxed_explicit_request_does_not_spill_onto_a_draining_rank(store, clock):
    """`relax_rank` on a full rank must pick a rank that is staying."""
    queue = make_queue(store, clock, [("a", 1), ("b", 1), ("c", 1)])
    drain(store, clock, "b")
    queue.enqueue(request(clock, "filler", explicit_rank="a"))
    queue.run_pass()
    queue.enqueue(request(clock, "e1", explicit_rank="a", relax_rank=True))
    assert placements(queue.run_pass()) == [("e1", "c", Placement.AWAY)]
    store.check_integrity()


def test_full_staying_ranks_make_new_work_wait_not_spill(store, clock):
    """A new conversation must wait for a staying rank rather than land on a leaving one."""
    queue = make_queue(store, clock, [("a", 2), ("b", 1)])
    drain(store, clock, "a", free=2)
    queue.enqueue(request(clock, "filler", explicit_rank="b"))
    queue.run_pass()
    queue.enqueue(request(clock, "n1", "new-conv"))
    assert placements(queue.run_pass()) == []
    assert [r.request_id for r in queue.waiting()] == ["n1"]
    store.check_integrity()


def test_a_pool_draining_entirely_still_serves(store, clock):
    """A pool scaled to zero would time out every request in the queue until its ranks left."""
    queue = make_queue(store, clock, [("a", 1), ("b", 1)])
    drain(store, clock, "a")
    drain(store, clock, "b")
    queue.enqueue(request(clock, "n1", "new-conv"))
    assert [rank for _, rank, _ in placements(queue.run_pass())] == ["a"]
    store.check_integrity()


def test_cancelled_drain_opens_the_rank_again(store, clock):
    """A drain cancelled by returning load must give the rank new conversations again."""
    queue = make_queue(store, clock, [("a", 4), ("b", 1)])
    drain(store, clock, "a")
    drain(store, clock, "a", draining=False)
    queue.enqueue(request(clock, "n1", "new-conv"))
    assert placements(queue.run_pass()) == [("n1", "a", Placement.NEW)]
    store.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    capacities=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    draining=st.lists(st.booleans(), min_size=5, max_size=5),
    arrivals=st.lists(st.integers(1, 3), min_size=1, max_size=12),
)
def test_policy_placements_never_land_on_a_draining_rank_while_one_stays(
    capacities, draining, arrivals
):
    """Property: with any staying rank, no new conversation is ever placed on a leaving one."""
    store = LocalStore()
    ranks = [(f"r{i}", capacity) for i, capacity in enumerate(capacities)]
    queue = make_queue(store, frozen_clock, ranks)
    flags = draining[: len(ranks)]
    leaving = {rank_id for (rank_id, _), flag in zip(ranks, flags, strict=True) if flag}
    for rank_id, capacity in ranks:
        drain(store, frozen_clock, rank_id, rank_id in leaving, capacity)
    for i, slots in enumerate(arrivals):
        queue.enqueue(request(frozen_clock, f"n{i}", f"conv-{i}", child_samples=slots - 1))
    result = queue.run_pass()
    placed_on = {admission.rank.rank_id for admission in result.admitted}
    if len(leaving) < len(ranks):
        assert not placed_on & leaving
    store.check_integrity()


def test_heartbeat_over_grpc_turns_new_work_away(clock):
    """The flag would be lost between the engine and admission if the RPC dropped it."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    engines = [FakeEngine("r0", 4), FakeEngine("r1", 1)]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        for engine in engines:
            engine.join(f"127.0.0.1:{port}", heartbeat_interval=30)  # no beats during the test
        wait_until(lambda: len(server.runtime.ranks()) == 2)
        registry = router_pb2_grpc.RankRegistryStub(channel)
        load = router_pb2.RankLoad(free_slots=4, draining=True)
        reply = registry.Heartbeat(router_pb2.HeartbeatRequest(rank_id="r0", load=load), timeout=5)
        assert reply.registered
        assert server.runtime.ranks()["r0"].load.draining
        turn = router_pb2.GenerateRequest(
            conversation_id="conv-new",
            prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
            max_tokens=1,
        )
        [response] = router_pb2_grpc.RouterStub(channel).Generate(turn, timeout=10)
        assert (response.rank_id, response.placement) == ("r1", "new")
    finally:
        channel.close()
        for engine in engines:
            engine.kill()
        server.runtime.store.check_integrity()
        server.stop(0)
