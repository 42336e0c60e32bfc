"""Property tests: random arrivals, finishes and passes never break the admission invariants."""

from __future__ import annotations

from hypothesis import given, settings
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


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(step, max_size=60), affinity=st.sampled_from(["strict", "lenient"]))
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
