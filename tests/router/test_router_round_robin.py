"""The prefix-blind baseline: affinity `none` ignores pins, `round_robin` takes ranks in turn."""

from __future__ import annotations

from kvfleet.services.router.admission import AdmissionConfig, AdmissionQueue
from kvfleet.services.router.model import PendingRequest, Placement, RankInfo


def make_queue(store, clock):
    for rank_id in ("a", "b", "c"):
        store.register_rank(RankInfo(rank_id, f"{rank_id}:1", 4), clock())
    config = AdmissionConfig(affinity="none", placement="round_robin")
    return AdmissionQueue(store, config, clock)


def admit(queue, clock, request_id, conversation):
    queue.enqueue(PendingRequest(request_id, conversation, clock()))
    [admission] = queue.run_pass().admitted
    queue.store.release(admission.rank.rank_id, request_id)
    return admission


def test_turns_of_one_conversation_go_round_the_ranks(store, clock):
    """A pinned turn that went home would make the baseline measure affinity, not its absence."""
    queue = make_queue(store, clock)
    turns = [admit(queue, clock, f"c1-t{i}", "c1") for i in range(4)]
    assert [a.rank.rank_id for a in turns] == ["a", "b", "c", "a"]
    assert {a.placement for a in turns} == {Placement.NEW}
    store.check_integrity()
