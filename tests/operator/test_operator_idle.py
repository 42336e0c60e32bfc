"""An idle fleet costs the API server reads only: no PATCH, PUT, POST or Event once converged.

Lists are served as a real API server serves them (items without apiVersion/kind, quantities
in canonical form), so a comparison that reads text instead of meaning shows up here.
"""

from __future__ import annotations

import copy

import pytest
from apiserver_like import serve_lists_like_apiserver
from fleet_tools import condition, mark_workloads_ready, writes
from kvfleet.operator.children import CHILD_RESOURCES
from operator_testkit import eventually
from test_operator_handlers import BASE_SPEC, FLEET_PATH, fleet_body, send

IDLE_TICKS = 5
# kmock never bumps resourceVersion and its watch repeats what its list returned, so kopf may
# replay the fleet's creation once (writing its status again), on a loaded machine even after
# Ready. A fleet that writes on every tick never has a quiet window; a replay only delays one.
WINDOWS = 4
# Quantities the server rewrites: 1000m is stored as 1 (and the managed Redis's 1024Mi as 1Gi,
# the GPU count 1 as "1").
SPEC = copy.deepcopy(BASE_SPEC)
SPEC["pools"]["context"]["resources"] = {"requests": {"cpu": "1000m"}}


def ticks(k8s) -> int:
    """Passes the operator has made: each lists the NetworkPolicies once."""
    return sum(
        1
        for r in list(k8s)
        if r.method.value == "GET" and r.resource and r.resource.plural == "networkpolicies"
    )


@pytest.mark.slow  # about 8 s on a loaded machine: a fleet, Ready, then at least 5 quiet ticks
async def test_a_converged_idle_fleet_writes_nothing(k8s, operator):
    """Each tick would re-patch every child (and post an Event) if a live child that means
    what the manifest says were taken for drift."""
    serve_lists_like_apiserver(k8s, {r.plural for r in CHILD_RESOURCES.values()})
    await send(k8s, "POST", FLEET_PATH, fleet_body("idle", SPEC, uid="uid-idle"))
    await eventually(lambda: condition(k8s, "idle", "Ready"))
    await mark_workloads_ready(k8s, "idle")
    await eventually(lambda: condition(k8s, "idle", "Ready")["status"] == "True")
    seen = []
    for _ in range(WINDOWS):
        start, first_tick = len(list(k8s)), ticks(k8s)
        await eventually(lambda until=first_tick + IDLE_TICKS: ticks(k8s) >= until)
        seen.append(writes(list(k8s)[start:]))
        if not seen[-1]:
            break
    assert seen[-1] == [], f"every window of {IDLE_TICKS} ticks wrote: {seen}"
