"""Ready tells the truth, one rule per test, on Outcomes built by hand (no API)."""

from __future__ import annotations

import copy

from fleet_tools import ready_status
from kvfleet.operator.children import resource_of
from kvfleet.operator.readiness import readiness
from kvfleet.operator.reconcile import Outcome

ROUTER = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "f-router"}}
POOL = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "f-generation"}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "f-router"}}


def running(manifest: dict, replicas: int = 2, generation: int = 1, **status) -> dict:
    """A live workload whose controller has rolled out `replicas` pods, all ready; `status`
    overrides fields of its status."""
    live = copy.deepcopy(manifest)
    live["metadata"]["generation"] = generation
    live["spec"] = {"replicas": replicas}
    live["status"] = {**ready_status(replicas), "observedGeneration": generation, **status}
    return live


def outcome(*live: dict, desired: tuple[dict, ...] = (ROUTER, POOL, SERVICE)) -> Outcome:
    by_key = {(resource_of(obj), obj["metadata"]["name"]): obj for obj in live}
    return Outcome(live=by_key, desired=list(desired))


def test_every_child_live_and_every_pod_ready_is_ready():
    """The baseline the other rules break one at a time."""
    state = readiness(outcome(running(ROUTER), running(POOL), SERVICE))
    assert (state.ready, state.reason) == (True, "Ready")


def test_a_missing_child_is_not_ready():
    """A fleet whose router Service is gone cannot be reached."""
    state = readiness(outcome(running(ROUTER), running(POOL)))
    assert (state.ready, state.message) == (False, "missing Service/f-router")


def test_a_conflict_is_not_ready():
    """A child name held by someone else means that child is not the fleet's."""
    conflicted = Outcome(conflicts=["services/f-router exists"], live={}, desired=[SERVICE])
    assert readiness(conflicted).reason == "Conflict"


def test_a_spec_the_controller_has_not_seen_is_not_ready():
    """Ready pods of the old spec say nothing of the new one (observedGeneration behind)."""
    pool = running(POOL, generation=3, observedGeneration=2)
    state = readiness(outcome(running(ROUTER), pool, SERVICE))
    assert (state.ready, state.message) == (
        False,
        "waiting for StatefulSet/f-generation not yet observed",
    )


def test_fewer_ready_pods_than_wanted_is_not_ready():
    """One of two ranks still starting: the pool is short."""
    pool = running(POOL, readyReplicas=1)
    state = readiness(outcome(running(ROUTER), pool, SERVICE))
    assert (state.ready, state.message) == (False, "waiting for StatefulSet/f-generation 1/2 ready")


def test_pods_not_on_the_newest_template_are_a_rollout():
    """All pods ready but one still runs the old template: a rollout is under way."""
    router = running(ROUTER, updatedReplicas=1)
    state = readiness(outcome(router, running(POOL), SERVICE))
    assert (state.ready, state.reason) == (False, "Progressing")
    assert state.message == "waiting for Deployment/f-router rolling out (1/2 updated)"


def test_a_statefulset_between_revisions_is_a_rollout():
    """Counts all fine but the controller's current revision is not the update revision."""
    pool = running(POOL, currentRevision="rev-1", updateRevision="rev-2")
    state = readiness(outcome(running(ROUTER), pool, SERVICE))
    assert (state.ready, state.reason) == (False, "Progressing")
    assert (
        state.message
        == "waiting for StatefulSet/f-generation rolling out (revision rev-1 -> rev-2)"
    )


def test_deployments_have_no_revisions_to_compare():
    """A Deployment's status has no currentRevision/updateRevision: their absence is no gap."""
    router = running(ROUTER)
    del router["status"]["currentRevision"], router["status"]["updateRevision"]
    assert readiness(outcome(router, running(POOL), SERVICE)).ready


def test_an_enabled_pool_scaled_to_zero_is_not_ready():
    """0/0 ready is not ready: a fleet with no pod in one of its pools cannot serve."""
    pool = running(POOL, replicas=0)
    state = readiness(outcome(running(ROUTER), pool, SERVICE))
    assert (state.ready, state.reason) == (False, "PoolEmpty")
    assert state.message == "StatefulSet/f-generation has no replica (scaled to 0)"


def test_nothing_desired_is_ready_only_with_nothing_missing():
    """Never "all ready" on nothing: with no live children every desired one is missing."""
    assert not readiness(outcome()).ready
