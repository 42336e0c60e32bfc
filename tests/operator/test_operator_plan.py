"""Planning child changes: exact patches, no-ops, deletions."""

from __future__ import annotations

from kvfleet.operator.children import CHILD_RESOURCES, render_children
from kvfleet.operator.names import FleetRef
from kvfleet.operator.plan import contained, drift_patch, merge_diff, plan_children
from kvfleet.operator.spec import parse_spec

FLEET = FleetRef("f", "ns", "uid")
SPEC = parse_spec({"model": {"name": "m", "path": "/m"}})
STS = CHILD_RESOURCES[("apps/v1", "StatefulSet")]


def applied(children: list[dict]) -> dict:
    """Live objects as the API would hold them after applying `children`."""
    return {(a.resource, a.name): a.body for a in plan_children(children, {})}


def test_merge_diff_nulls_removed_keys_and_keeps_equal_ones():
    """A removed key must become null, an equal one must not appear."""
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}
    new = {"a": 1, "b": {"c": 2}, "e": [1, 2], "f": 4}
    assert merge_diff(old, new) == {"b": {"d": None}, "e": [1, 2], "f": 4}


def test_unchanged_fleet_plans_nothing():
    """Reconciling an applied fleet again must make no API call."""
    children = render_children(FLEET, SPEC, {"context": 1, "generation": 1})
    assert plan_children(children, applied(children)) == []


def test_replica_change_patches_only_replicas():
    """A pool resize must be one patch of that StatefulSet's replicas (and its annotation);
    from one rank up its budget changes too (test_operator_disruption.py)."""
    before = render_children(FLEET, SPEC, {"context": 1, "generation": 2})
    after = render_children(FLEET, SPEC, {"context": 1, "generation": 3})
    [action] = plan_children(after, applied(before))
    assert (action.verb, action.resource, action.name) == ("patch", STS, "f-generation")
    assert action.body["spec"] == {"replicas": 3}
    assert set(action.body["metadata"]) == {"annotations"}


def test_switching_to_external_redis_deletes_managed_redis():
    """Dropping the managed Redis must delete its Deployment and Service."""
    before = render_children(FLEET, SPEC, {"context": 1, "generation": 1})
    external = parse_spec(
        {
            "model": {"name": "m", "path": "/m"},
            "redis": {"mode": "external", "url": "redis://r:6379/0"},
        }
    )
    after = render_children(FLEET, external, {"context": 1, "generation": 1})
    deletes = [
        (a.resource.plural, a.name)
        for a in plan_children(after, applied(before))
        if a.verb == "delete"
    ]
    assert sorted(deletes) == [
        ("deployments", "f-redis"),
        ("networkpolicies", "f-redis"),
        ("poddisruptionbudgets", "f-redis"),
        ("services", "f-redis"),
    ]


def test_quantities_compare_by_value_and_only_in_resource_maps():
    """`1024Mi` stored as `1Gi` (or a GPU count 1 as "1") is no drift; a real change of a
    quantity is; and text outside requests/limits is never read as a quantity."""
    resources = {"requests": {"memory": "1024Mi", "cpu": "1000m"}, "limits": {"gpu": 1}}
    stored = {"requests": {"memory": "1Gi", "cpu": "1"}, "limits": {"gpu": "1"}}
    assert contained({"resources": resources}, {"resources": stored})
    assert drift_patch({"resources": resources}, {"resources": stored}) == {}
    grown = {"requests": {"memory": "2Gi", "cpu": "1"}, "limits": {"gpu": "1"}}
    assert drift_patch({"resources": resources}, {"resources": grown}) == {
        "resources": {"requests": {"memory": "1024Mi"}}
    }
    assert not contained({"env": {"value": "1000m"}}, {"env": {"value": "1"}})
