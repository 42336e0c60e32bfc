"""Engine pods ask for the memory their host KV tier needs, whatever the pool's resources say."""

from __future__ import annotations

from kubernetes.utils.quantity import parse_quantity
from kvfleet.operator.names import FleetRef
from kvfleet.operator.render_pools import ENGINE_PROCESS_GIB, render_pool
from kvfleet.operator.spec import parse_spec

GIB = 2**30


def engine_resources(pool: dict, host_gib: int) -> dict:
    spec = parse_spec(
        {
            "model": {"name": "m", "path": "p"},
            "pools": {"generation": {"gpusPerPod": 2, **pool}},
            "kvTiers": {"hostGiB": host_gib},
        }
    )
    [statefulset, _] = render_pool(FleetRef("f", "ns", "u"), spec, "generation", 1)
    return statefulset["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_requests_cover_every_ranks_host_tier():
    """A pod asking for less is scheduled where its tier does not fit, then OOM-killed."""
    resources = engine_resources({"ranksPerPod": 2}, host_gib=128)
    need = (2 * 128 + ENGINE_PROCESS_GIB) * GIB
    assert parse_quantity(resources["requests"]["memory"]) == need
    assert "memory" not in resources.get("limits", {})  # no limit given: none added


def test_a_smaller_request_or_limit_is_raised_and_a_larger_kept():
    """The pool's own figures count only when they hold the tier."""
    small = engine_resources(
        {"resources": {"requests": {"memory": "16Gi"}, "limits": {"memory": "32Gi"}}}, 64
    )
    need = (64 + ENGINE_PROCESS_GIB) * GIB
    assert parse_quantity(small["requests"]["memory"]) == need
    assert parse_quantity(small["limits"]["memory"]) == need
    large = engine_resources({"resources": {"requests": {"memory": "500Gi"}}}, 64)
    assert large["requests"]["memory"] == "500Gi"
