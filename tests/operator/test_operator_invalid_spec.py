"""Specs the operator cannot run, end to end: each becomes SpecValid=False (InvalidSpec) and a
Warning Event naming the field, and no child is made. kmock does not apply the CRD schema, so
these also show what a server with an old CRD (or none of its bounds) would get."""

from __future__ import annotations

import copy

import pytest
from fleet_tools import condition
from kvfleet.operator.children import CHILD_RESOURCES
from operator_testkit import eventually
from test_operator_handlers import BASE_SPEC, FLEET_PATH, fleet_body, send

CHILD_PLURALS = {resource.plural for resource in CHILD_RESOURCES.values()}
LONG_NAME = "a" * 42  # one over the longest name whose pods' labels fit in 63 characters


def with_fields(**sections) -> dict:
    spec = copy.deepcopy(BASE_SPEC)
    for section, value in sections.items():
        spec[section] = {**spec.get(section, {}), **value}
    return spec


CASES = {
    "memory-not-a-quantity": (
        "bad-memory",
        with_fields(pools={"context": {"resources": {"requests": {"memory": "banana"}}}}),
        'spec.pools.context.resources.requests.memory: "banana" is not a quantity',
    ),
    "too-many-replicas": (
        "bad-replicas",
        with_fields(pools={"generation": {"replicas": 5000}}),
        "spec.pools.generation.replicas: Input should be less than or equal to 1000",
    ),
    "too-many-routers": (
        "bad-routers",
        with_fields(routing={"replicas": 17}),
        "spec.routing.replicas: Input should be less than or equal to 16",
    ),
    "duplicate-ports": (
        "bad-ports",
        with_fields(ports={"routerMetrics": 8000}),
        "spec.ports.routerHttp and spec.ports.routerMetrics: both 8000",
    ),
    "name-too-long": (LONG_NAME, BASE_SPEC, f'metadata.name: "{LONG_NAME}" is 42 characters'),
}


def warnings(k8s, reason: str) -> list[str]:
    """Messages of the Warning Events posted with this reason (from kmock's request log)."""
    return [
        r.data["message"]
        for r in list(k8s["post"])
        if r.resource is not None
        and r.resource.plural == "events"
        and r.data.get("reason") == reason
        and r.data.get("type") == "Warning"
    ]


def children(k8s, fleet: str) -> list[str]:
    return [
        name
        for (resource, _, name), obj in list(k8s.objects.items())
        if resource.plural in CHILD_PLURALS and not obj.deleted and name.startswith(f"{fleet}-")
    ]


@pytest.mark.parametrize(("name", "spec", "message"), CASES.values(), ids=list(CASES))
async def test_invalid_spec_is_a_condition_and_a_warning_naming_the_field(
    k8s, operator, name, spec, message
):
    """A spec the schema or the operator refuses would crash the reconcile (or make children
    the server refuses) instead of telling the user which field is wrong."""
    await send(k8s, "POST", FLEET_PATH, fleet_body(name, spec, uid=f"uid-{name}"))
    spec_valid = await eventually(lambda: condition(k8s, name, "SpecValid"))
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "InvalidSpec")
    assert message in spec_valid["message"]
    ready = condition(k8s, name, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    [warning] = await eventually(lambda: warnings(k8s, "InvalidSpec"))
    assert message in warning
    assert children(k8s, name) == []
    assert not operator.done()
