"""Property tests: random arrivals, finishes and passes never break the admission invariants."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo
from kvfleet.services.router.store import LocalStore

RANKS = {"a": 2, "b": 3, "c": 1}
BOUND = 3

arrival = st.tuples(
    st.just("arrive"),
    st.sampled_from(["", "c1", "c2", "c3", "c4"]),
    st.integers(0, 1),  # child samples
    st.sampled_from([None, "a", "b"]),  # explicit rank
    st.booleans(),  # relax
)
step = st.one_of(
    arrival,
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("pass")),
    st.tuples(st.just("tick"), st.floats(0.0, 2.0)),
)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


# A pinned request past its wait bound (in time) when its full home frees a slot, while another
# rank has more free: it must go home (lenient affinity), not to the least loaded rank.
RELEASED_WITH_ROOM_AT_HOME = [
    ("arrive", "c1", 0, "b", False),
    ("pass",),
    ("finish", 0),
    ("arrive", "", 1, "b", False),
    ("arrive", "", 0, "b", False),
    ("pass",),
    ("arrive", "c1", 0, None, False),
    ("pass",),
    ("tick", 2.0),
    ("tick", 2.0),
    ("tick", 2.0),
    ("finish", 1),
    ("pass",),
]


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(step, max_size=60), affinity=st.sampled_from(["strict", "lenient"]))
@example(steps=RELEASED_WITH_ROOM_AT_HOME, affinity="strict")
def test_random_traffic_keeps_admission_invariants(steps, affinity):
    """Capacity, exactly-once admission or the wait bound is broken somewhere in the core."""
    clock, store = Clock(), LocalStore()
    for rank_id, capacity in RANKS.items():
        store.register_rank(RankInfo(rank_id, rank_id, capacity), 0.0)
    config = AdmissionConfig(affinity=affinity, max_wait_passes=BOUND, max_wait_seconds=5.0)
    queue = AdmissionQueue(store, config, clock)
    running: list[tuple[str, str]] = []
    admitted_ids: set[str] = set()
    for i, op in enumerate(steps):
        if op[0] == "arrive":
            _, conv, children, explicit, relax = op
            queue.enqueue(PendingRequest(f"q{i}", conv, clock(), children, explicit, relax))
        elif op[0] == "finish" and running:
            rank_id, request_id = running.pop(op[1] % len(running))
            store.release(rank_id, request_id)
        elif op[0] == "tick":
            clock.now += op[1]
        elif op[0] == "pass":
            pins_before = store.get_pins({r.conversation_id for r in queue.waiting()}, clock())
            result = queue.run_pass()
            check_home_first(result, pins_before, queue)
            for admission in result.admitted:
                request = admission.request
                assert request.request_id not in admitted_ids
                admitted_ids.add(request.request_id)
                running.append((admission.rank.rank_id, request.request_id))
                if admission.placement is Placement.PINNED:
                    assert pins_before[request.conversation_id] == admission.rank.rank_id
                if admission.placement is Placement.FALLBACK:
                    waited = clock() - request.enqueued_at
                    assert request.deferrals >= BOUND or waited >= 5.0
                assert request.deferrals <= BOUND
        store.check_integrity()
        waiting = {r.request_id for r in queue.waiting()}
        assert waiting.isdisjoint(admitted_ids)


def check_home_first(result, pins_before, queue) -> None:
    """A pinned request placed away from its home, its wait bound run out or not, found no room
    there: lenient affinity (what a released request is placed by) tries home first.

    Free slots only shrink within a pass, so room left at home after the pass was there when
    the request was placed; unless a request still waiting for that home held it."""
    held_homes = {pins_before.get(r.conversation_id) for r in queue.waiting()}
    for admission in result.admitted:
        request = admission.request
        home = pins_before.get(request.conversation_id)
        if request.explicit_rank is not None or home is None or home == admission.rank.rank_id:
            continue
        if home in held_homes or home not in result.free_slots:
            continue
        assert result.free_slots[home] < request.slots, (
            f"{request.request_id} placed {admission.placement} on {admission.rank.rank_id} "
            f"while its home {home} had {result.free_slots[home]} free"
        )
