"""Two operator replicas (real `kvfleet operator --peering` processes, as the chart's service
account) elect a leader on a real API server: a standby takes over within the bound after the
leader is killed, and a standby never runs a handler while the leader lives."""

from __future__ import annotations

import copy
import itertools
import os
import signal
import time

import kubernetes
import pytest
import yaml
from k8s_kit import wait_sync
from kvfleet.operator.names import GROUP, PLURAL, VERSION
from operator_replicas import PAUSED, RESUMED, Replicas, keepalives
from operator_testkit import EXAMPLE_FLEET

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

# The target is 15 s from the leader's death to the standby's first write; the bound leaves
# room for a loaded machine (the kill comes right after a keep-alive: the worst case).
FAILOVER_BOUND_SECONDS = 20.0
WAIT_SECONDS = 120.0  # only a failure waits this long
# The least time a leader gets between its pause and a joining replica's first handler.
HANDLER_GRACE_SECONDS = 1.0
_numbers = itertools.count(1)


@pytest.fixture
def replicas(chart, operator_identity, tmp_path):
    started = Replicas(operator_identity, f"{chart['release']}-kvfleet", tmp_path)
    try:
        yield started
    finally:
        started.stop()
        for replica in started.started:
            print(f"--- {replica.name} (priority {replica.priority}) ---")
            print(replica.log.read_text(errors="replace")[-4000:])


@pytest.fixture
def fleet(chart) -> dict:
    """A fleet (one router, no autoscaling) in a namespace of its own."""
    client = chart["client"]
    number = next(_numbers)
    namespace, name = f"failover-{number}", f"fleet{number}"
    kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": namespace}})
    spec = copy.deepcopy(yaml.safe_load(EXAMPLE_FLEET.read_text())["spec"])
    spec["autoscaling"]["enabled"] = False
    spec["routing"]["replicas"] = 1
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KVFleet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    custom = kubernetes.client.CustomObjectsApi(client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return {"client": client, "namespace": namespace, "name": name, "custom": custom}


def router_replicas(fleet: dict) -> int | None:
    """spec.replicas of the fleet's router Deployment; None until the operator made it."""
    apps = kubernetes.client.AppsV1Api(fleet["client"])
    try:
        deployment = apps.read_namespaced_deployment(f"{fleet['name']}-router", fleet["namespace"])
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return deployment.spec.replicas


def test_standby_takes_over_within_bound_after_leader_is_killed(replicas, fleet, chart):
    """With kopf's default keep-alive lifetime a standby waited up to a minute for a dead leader,
    and the fleets went unreconciled all that while."""
    peering = f"{chart['release']}-kvfleet"
    leader = replicas.start("leader", priority=2)
    wait_sync(lambda: router_replicas(fleet) == 1, timeout=WAIT_SECONDS)
    standby = replicas.start("standby", priority=1)
    wait_sync(lambda: standby.first("Initial authentication"), timeout=WAIT_SECONDS)
    # Past its start-up and keeping its record fresh: it has read the peering object and paused.
    first_record = wait_sync(lambda: keepalives(chart["client"], peering).get(1), WAIT_SECONDS)
    wait_sync(lambda: keepalives(chart["client"], peering).get(1) != first_record, WAIT_SECONDS)
    assert standby.handler_runs() == [], "the standby ran handlers beside a live leader"

    last = keepalives(chart["client"], peering)[2]
    wait_sync(lambda: keepalives(chart["client"], peering)[2] != last, timeout=WAIT_SECONDS)
    os.kill(leader.process.pid, signal.SIGKILL)  # right after a keep-alive: the longest wait
    killed = time.monotonic()
    leader.process.wait()
    fleet["custom"].patch_namespaced_custom_object(
        GROUP, VERSION, fleet["namespace"], PLURAL, fleet["name"],
        {"spec": {"routing": {"replicas": 2}}},
    )  # fmt: skip
    wait_sync(lambda: router_replicas(fleet) == 2, timeout=WAIT_SECONDS)
    failover = time.monotonic() - killed
    print(f"failover: the standby reconciled {failover:.1f} s after the leader's kill -9")
    assert failover <= FAILOVER_BOUND_SECONDS
    wait_sync(standby.handler_runs, timeout=WAIT_SECONDS)  # it was the standby that acted
    assert standby.forbidden() == [] and leader.forbidden() == []


def test_a_replica_joining_a_live_leader_acts_only_after_the_leader_paused(replicas, fleet):
    """kopf alone let a joining replica of higher priority run handlers on its first read of the
    peering object, as the leader was only seeing it: both ran handlers for a moment."""
    first = replicas.start("first", priority=1)
    wait_sync(lambda: router_replicas(fleet) == 1, timeout=WAIT_SECONDS)  # it leads
    joining = replicas.start("joining", priority=2)
    paused = wait_sync(lambda: first.first(PAUSED), timeout=WAIT_SECONDS)
    wait_sync(joining.handler_runs, timeout=WAIT_SECONDS)  # it leads now
    acting = min(joining.first(RESUMED), joining.handler_runs()[0][0])
    print(f"handover: the joining replica acted {(acting - paused).total_seconds():.3f} s after"
          " the leader paused")  # fmt: skip
    # kopf's pause lets a handler the leader had begun run to its end: a pause only a few
    # milliseconds ahead of the joining replica's first handler does not keep the two apart.
    assert (acting - paused).total_seconds() >= HANDLER_GRACE_SECONDS
    assert [run for run in first.handler_runs() if run[0] >= acting] == []
    assert first.forbidden() == [] and joining.forbidden() == []


def test_a_replica_of_the_leaders_priority_stops_and_leaves_the_leader_alone(
    replicas, fleet, chart
):
    """kopf pauses every replica of an equal priority, the leader too: no one would lead."""
    leader = replicas.start("leader", priority=5)
    wait_sync(lambda: router_replicas(fleet) == 1, timeout=WAIT_SECONDS)
    twin = replicas.start("twin", priority=5)
    assert twin.process.wait(timeout=WAIT_SECONDS) != 0
    assert any("this replica's priority 5" in text for _, text in twin.lines())
    assert twin.handler_runs() == []
    assert list(keepalives(chart["client"], f"{chart['release']}-kvfleet")) == [5]
    assert leader.first(PAUSED) is None
