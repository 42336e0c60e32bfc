"""The checks a CRD schema cannot express, one rule each: quantities, colliding ports, fleet
names; every message names the field from `spec.` (or `metadata.`) down."""

from __future__ import annotations

import pytest
from kvfleet.operator.names import FleetRef
from kvfleet.operator.spec import SpecError, parse_fleet, parse_spec
from kvfleet.operator.spec_checks import MAX_FLEET_NAME

BASE = {"model": {"name": "m", "path": "/m"}}


def problems(raw: dict, name: str = "fleet") -> str:
    with pytest.raises(SpecError) as raised:
        parse_fleet(name, {**BASE, **raw})
    return str(raised.value)


def test_a_valid_spec_and_name_pass():
    """The checks must not refuse what runs."""
    resources = {"requests": {"cpu": "1500m", "memory": "80Gi"}, "limits": {"nvidia.com/gpu": 2}}
    spec = parse_fleet(
        "a" * MAX_FLEET_NAME, {**BASE, "pools": {"context": {"resources": resources}}}
    )
    assert spec.pools.context.resources == resources


def test_a_resource_value_that_is_no_quantity_is_named():
    """A bad quantity would reach the renderer (which parses it) and crash every reconcile."""
    raw = {"pools": {"context": {"resources": {"requests": {"memory": "banana"}}}}}
    assert (
        problems(raw) == 'spec.pools.context.resources.requests.memory: "banana" is not a quantity'
    )


def test_an_unknown_resources_key_is_named():
    """`resources.memory` (missing its requests level) would be rejected by the API server."""
    raw = {"pools": {"generation": {"resources": {"memory": "1Gi"}}}}
    assert problems(raw) == "spec.pools.generation.resources.memory: unknown key (requests, limits)"


def test_a_disk_size_that_is_no_quantity_is_named():
    """The PVC would be refused by the server, leaving the engines without their volume."""
    assert problems({"kvTiers": {"disk": {"size": "lots"}}}) == (
        'spec.kvTiers.disk.size: "lots" is not a quantity'
    )


def test_pool_and_router_counts_are_bounded():
    """10000 replicas (a typo) must be refused, not scheduled; likewise 17 routers."""
    assert "spec.pools.generation.replicas: Input should be less than or equal to 1000" in (
        problems({"pools": {"generation": {"replicas": 10000}}})
    )
    assert "spec.routing.replicas: Input should be less than or equal to 16" in (
        problems({"routing": {"replicas": 17}})
    )
    assert "spec.autoscaling.context.maxReplicas: Input should be less" in (
        problems({"autoscaling": {"context": {"maxReplicas": 1001}}})
    )


def test_two_router_ports_alike_are_named():
    """The router would fail to bind its second listener and crash-loop."""
    assert problems({"ports": {"routerGrpc": 9400}}) == (
        "spec.ports.routerGrpc and spec.ports.routerMetrics: both 9400"
    )


def test_engine_port_ranges_of_several_ranks_must_not_overlap():
    """Rank i listens on base + i: with 2 ranks, http 8000 and metrics 8001 collide on 8001."""
    raw = {
        "pools": {"generation": {"ranksPerPod": 2, "gpusPerPod": 2}},
        "ports": {"engineHttp": 8000, "engineMetrics": 8001},
    }
    assert problems(raw) == (
        "spec.ports.engineHttp and spec.ports.engineMetrics: 8000-8001 and 8001-8002 overlap "
        "(one port per rank)"
    )
    assert "passes 65535" in problems({**raw, "ports": {"engineGrpc": 65535}})


def test_router_and_engine_may_share_a_port_number():
    """They run in different pods: the defaults give both HTTP servers 8000."""
    spec = parse_spec(BASE)
    assert spec.ports.router_http == spec.ports.engine_http


def test_a_long_fleet_name_is_refused_before_its_pods_would_be():
    """A StatefulSet name over 52 characters makes pods whose revision label passes 63."""
    name = "a" * (MAX_FLEET_NAME + 1)
    assert problems({}, name).startswith(f'metadata.name: "{name}" is 42 characters')
    longest = FleetRef("a" * MAX_FLEET_NAME, "ns", "uid").child_name("generation")
    assert len(longest) + len("-0123456789") <= 63


def test_a_name_that_is_no_dns_label_is_refused():
    """Services are named after the fleet: `9fleet-router` is no valid Service name."""
    assert "must start with a letter" in problems({}, "9fleet")


def test_cross_field_problems_each_name_their_field_from_spec():
    """Every problem of a spec with several must come back, each starting at `spec.`."""
    raw = {
        "redis": {"mode": "external"},
        "autoscaling": {"generation": {"minReplicas": 5, "maxReplicas": 2}},
    }
    lines = problems(raw).split("; ")
    assert lines == [
        "spec.redis.mode=external needs exactly one of url, urlSecretRef (got 0)",
        "spec.autoscaling.generation: minReplicas=5 > maxReplicas=2",
    ]
