"""Admission rules of DESIGN.md "Router", on the in-process and the Redis store."""

from __future__ import annotations

import pytest
from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo


def make_queue(store, clock, affinity="strict", passes=2, seconds=60.0, ranks=(("a", 1), ("b", 1))):
    for rank_id, capacity in ranks:
        store.register_rank(RankInfo(rank_id, f"{rank_id}:1", capacity), clock())
    config = AdmissionConfig(affinity=affinity, max_wait_passes=passes, max_wait_seconds=seconds)
    return AdmissionQueue(store, config, clock)


def request(clock, request_id, conversation="", **kwargs) -> PendingRequest:
    return PendingRequest(request_id, conversation, clock(), **kwargs)


def pin(queue, clock, conversation, rank_id):
    """Pin a conversation to a rank by admitting a first turn there, then finishing it."""
    queue.enqueue(request(clock, f"{conversation}-t0", conversation, explicit_rank=rank_id))
    [admission] = queue.run_pass().admitted
    queue.store.release(rank_id, admission.request.request_id)


def fill(queue, clock, rank_id, slots=1, tag="filler"):
    """Occupy slots of a rank with a conversation-less explicit request."""
    queue.enqueue(
        request(clock, f"{tag}-{rank_id}", explicit_rank=rank_id, child_samples=slots - 1)
    )
    assert [a.rank.rank_id for a in queue.run_pass().admitted] == [rank_id]


def placements(result):
    return [(a.request.request_id, a.rank.rank_id, a.placement) for a in result.admitted]


def test_pinned_turn_goes_home_when_home_has_room(store, clock):
    """Returning turns would lose their prefix if a free home rank were not used."""
    queue = make_queue(store, clock)
    pin(queue, clock, "c1", "b")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    assert placements(queue.run_pass()) == [("c1-t1", "b", Placement.PINNED)]
    store.check_integrity()


def test_two_pass_bound_defers_twice_then_falls_back(store, clock):
    """Strict affinity would never release (or release too soon) a request whose home is full."""
    queue = make_queue(store, clock, passes=2)
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    first, second, third = queue.run_pass(), queue.run_pass(), queue.run_pass()
    assert (first.deferrals, second.deferrals, third.deferrals) == (1, 1, 0)
    assert placements(first) == placements(second) == []
    assert placements(third) == [("c1-t1", "b", Placement.FALLBACK)]
    store.check_integrity()


@pytest.mark.parametrize(("deferrals", "still_pinned"), [(2, True), (3, False)])
def test_bound_n_releases_exactly_at_n(store, clock, deferrals, still_pinned):
    """An off-by-one in the bound would release a request one pass early or late."""
    queue = make_queue(store, clock, passes=3)
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    waiting = request(clock, "c1-t1", "c1", deferrals=deferrals)
    queue.enqueue(waiting)
    result = queue.run_pass()
    if still_pinned:
        assert (result.deferrals, placements(result), waiting.deferrals) == (1, [], 3)
    else:
        assert (result.deferrals, placements(result)) == (0, [("c1-t1", "b", Placement.FALLBACK)])
    store.check_integrity()


def test_time_bound_releases_without_more_passes(store, clock):
    """A pinned request could wait forever when passes are rare, without the bound in time."""
    queue = make_queue(store, clock, passes=100, seconds=2.0)
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    assert queue.run_pass().deferrals == 1
    clock.advance(2.0)
    assert placements(queue.run_pass()) == [("c1-t1", "b", Placement.FALLBACK)]
    store.check_integrity()


def test_expired_request_does_not_take_slot_of_still_pinned_one(store, clock):
    """Arrival order would hand the pinned request's home slot to a released request."""
    queue = make_queue(store, clock, passes=1, ranks=(("a", 1), ("b", 1)))
    pin(queue, clock, "old", "a")
    pin(queue, clock, "young", "a")
    fill(queue, clock, "a")
    fill(queue, clock, "b")
    expired = request(clock, "old-t1", "old", deferrals=1)  # at the bound: released
    queue.enqueue(expired)
    queue.enqueue(request(clock, "young-t1", "young"))
    store.release("a", "filler-a")  # one slot opens on a
    result = queue.run_pass()
    assert placements(result) == [("young-t1", "a", Placement.PINNED)]
    assert [r.request_id for r in queue.waiting()] == ["old-t1"]
    store.check_integrity()


def test_relaxed_explicit_first_turn_leaves_last_slot_to_pinned(store, clock):
    """Explicit-rank requests placed before pinned ones would steal the pinned turn's slot."""
    queue = make_queue(store, clock, ranks=(("a", 2), ("b", 2)))
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    queue.enqueue(request(clock, "new-t0", "new", explicit_rank="a", relax_rank=True))
    queue.enqueue(request(clock, "c1-t1", "c1"))
    result = queue.run_pass()
    assert placements(result) == [
        ("c1-t1", "a", Placement.PINNED),
        ("new-t0", "b", Placement.AWAY),
    ]
    store.check_integrity()


def test_pinned_parent_with_children_waits_and_never_overfills(store, clock):
    """A parent with children admitted into too few slots would over-fill its rank."""
    queue = make_queue(store, clock, passes=5, ranks=(("a", 3), ("b", 1)))
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a", slots=2)
    parent = request(clock, "c1-t1", "c1", child_samples=2)  # needs 3 slots, 1 free
    queue.enqueue(parent)
    queue.enqueue(request(clock, "other", "x"))
    result = queue.run_pass()
    # No rank could take all 3 slots, so waiting cost the parent nothing: no deferral.
    assert (result.deferrals, placements(result)) == (0, [("other", "b", Placement.NEW)])
    store.check_integrity()
    store.release("a", "filler-a")
    assert placements(queue.run_pass()) == [("c1-t1", "a", Placement.PINNED)]
    assert store.snapshot()["a"][0].used == 3
    store.check_integrity()


def test_lenient_sends_pinned_turn_away_at_once(store, clock):
    """Lenient mode would defer (act strict) if the affinity registry were ignored."""
    queue = make_queue(store, clock, affinity="lenient")
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    result = queue.run_pass()
    assert (result.deferrals, placements(result)) == (0, [("c1-t1", "b", Placement.AWAY)])
    store.check_integrity()


def test_degraded_pass_is_lenient(store, clock):
    """With Redis away the router would keep deferring on a store it cannot share."""
    queue = make_queue(store, clock)
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    assert placements(queue.run_pass(degraded=True)) == [("c1-t1", "b", Placement.AWAY)]


def test_strict_explicit_rank_waits_then_fails_when_rank_is_removed(store, clock):
    """A request for a vanished rank would hang in the queue forever."""
    queue = make_queue(store, clock)
    fill(queue, clock, "a")
    queue.enqueue(request(clock, "e1", explicit_rank="a"))
    assert placements(queue.run_pass()) == []
    store.remove_rank("a")
    result = queue.run_pass()
    assert [(r.request_id, reason) for r, reason in result.failed] == [
        ("e1", "rank 'a' is no longer registered")
    ]
    assert len(queue) == 0


def test_admission_pins_the_conversation(store, clock):
    """Without a pin on admission the next turn would be placed as a new conversation."""
    queue = make_queue(store, clock)
    queue.enqueue(request(clock, "c1-t0", "c1"))
    [admission] = queue.run_pass().admitted
    assert store.get_pins(["c1"], clock()) == {"c1": admission.rank.rank_id}


def test_removing_rank_releases_its_pins_and_slots(store, clock):
    """Pins to a dead rank would send every later turn to nowhere."""
    queue = make_queue(store, clock)
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    assert store.remove_rank("a") == 1
    assert store.get_pins(["c1"], clock()) == {}
    assert list(store.snapshot()) == ["b"]
    store.check_integrity()


def test_silent_rank_is_removed_after_heartbeat_timeout(store, clock):
    """A rank that stopped heartbeating would keep receiving requests."""
    queue = make_queue(store, clock)
    clock.advance(5)
    from kvfleet.services.router.model import RankLoad

    store.heartbeat("b", RankLoad(1, 0, 0.0), clock())
    clock.advance(queue.config.heartbeat_timeout_seconds)
    assert queue.remove_silent_ranks() == ["a"]
    assert list(store.snapshot()) == ["b"]


def test_cancel_removes_waiting_request(store, clock):
    """A client that hung up would still be admitted and hold a slot."""
    queue = make_queue(store, clock)
    fill(queue, clock, "a")
    fill(queue, clock, "b")
    queue.enqueue(request(clock, "x", "x"))
    assert queue.cancel("x") is True
    assert queue.cancel("x") is False
    assert len(queue) == 0


def test_passes_with_no_room_anywhere_do_not_use_up_the_bound(store, clock):
    """Counting passes where no rank had room would send returning turns away on a full fleet."""
    queue = make_queue(store, clock, passes=2, ranks=(("a", 1), ("b", 1)))
    pin(queue, clock, "c1", "a")
    fill(queue, clock, "a")
    fill(queue, clock, "b")
    queue.enqueue(request(clock, "c1-t1", "c1"))
    for _ in range(5):  # e.g. periodic ticks while the whole fleet is busy
        assert queue.run_pass().deferrals == 0
    store.release("b", "filler-b")
    assert (queue.run_pass().deferrals, queue.run_pass().deferrals) == (1, 1)
    assert placements(queue.run_pass()) == [("c1-t1", "b", Placement.FALLBACK)]
    store.check_integrity()
