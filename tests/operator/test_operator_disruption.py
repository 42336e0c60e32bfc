"""PodDisruptionBudgets on the rendered children: which pods an eviction may take, and that
every budget selects the pods it is meant to protect."""

from __future__ import annotations

from kvfleet.operator.children import CHILD_RESOURCES, render_children
from kvfleet.operator.names import FleetRef
from kvfleet.operator.plan import plan_children
from kvfleet.operator.spec import parse_spec

FLEET = FleetRef("f", "ns", "uid")
MODEL = {"model": {"name": "m", "path": "/m"}}
PDBS = CHILD_RESOURCES[("policy/v1", "PodDisruptionBudget")]


def budgets(raw: dict, replicas: dict[str, int]) -> dict[str, dict]:
    """Each budget's spec less its selector, by name."""
    children = render_children(FLEET, parse_spec({**MODEL, **raw}), replicas)
    return {
        child["metadata"]["name"]: {k: v for k, v in child["spec"].items() if k != "selector"}
        for child in children
        if child["kind"] == "PodDisruptionBudget"
    }


def test_a_single_rank_pool_cannot_be_evicted():
    """maxUnavailable 1 over one pod lets a drain stop the pool (the fleet) for a model load."""
    found = budgets({}, {"context": 1, "generation": 1})
    assert found["f-generation"] == {"minAvailable": 1}
    assert found["f-context"] == {"minAvailable": 1}


def test_a_larger_pool_loses_one_rank_at_a_time():
    """minAvailable 1 on three ranks would let a drain take two at once."""
    found = budgets({}, {"context": 1, "generation": 3})
    assert found["f-generation"] == {"maxUnavailable": 1}
    assert found["f-context"] == {"minAvailable": 1}


def test_routers_and_redis_may_lose_their_only_pod():
    """Both restart in seconds without losing state (the routers resync Redis from their
    mirrors): holding up node maintenance for them is not worth it; two routers still go one
    at a time."""
    found = budgets({}, {"context": 1, "generation": 1})
    assert found["f-router"] == {"maxUnavailable": 1}
    assert found["f-redis"] == {"maxUnavailable": 1}
    assert budgets({"routing": {"replicas": 2}}, {"context": 1, "generation": 1})["f-router"] == {
        "maxUnavailable": 1
    }


def test_external_redis_has_no_budget():
    """The operator runs no Redis then: a budget would select no pod."""
    external = {"redis": {"mode": "external", "url": "redis://r:6379/0"}}
    assert "f-redis" not in budgets(external, {"context": 1, "generation": 1})


def test_every_budget_selects_the_pods_of_one_workload():
    """A budget whose selector matches no pod template protects nothing."""
    children = render_children(FLEET, parse_spec(MODEL), {"context": 1, "generation": 2})
    templates = {
        child["metadata"]["name"]: child["spec"]["template"]["metadata"]["labels"]
        for child in children
        if child["kind"] in ("Deployment", "StatefulSet")
    }
    pdbs = [child for child in children if child["kind"] == "PodDisruptionBudget"]
    assert {pdb["metadata"]["name"] for pdb in pdbs} == set(templates)
    for pdb in pdbs:
        selector = pdb["spec"]["selector"]["matchLabels"]
        matching = [
            name for name, labels in templates.items() if selector.items() <= labels.items()
        ]
        assert matching == [pdb["metadata"]["name"]]


def test_growing_a_single_rank_pool_swaps_the_rule_in_one_patch():
    """A budget may hold only one of the two fields: the patch must null minAvailable."""
    spec = parse_spec(MODEL)
    before = render_children(FLEET, spec, {"context": 1, "generation": 1})
    live = {(a.resource, a.name): a.body for a in plan_children(before, {})}
    after = render_children(FLEET, spec, {"context": 1, "generation": 2})
    [patch] = [
        a for a in plan_children(after, live) if a.resource == PDBS and a.name == "f-generation"
    ]
    assert patch.body["spec"] == {"minAvailable": None, "maxUnavailable": 1}
