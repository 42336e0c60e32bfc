"""The chart's pre-delete hook (`kvfleet operator --release-fleets`) on a real API server, as the
chart's service account: the operator is stopped, kopf's finalizer comes off every fleet, and a
fleet and its namespace can then be deleted with no operator running."""

from __future__ import annotations

import copy

import kubernetes
import pytest
import yaml
from k8s_kit import wait_sync
from kvfleet.operator.names import FINALIZER, GROUP, PLURAL, VERSION
from kvfleet.operator.release import release_fleets, stop_operator
from operator_testkit import EXAMPLE_FLEET

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

NAMESPACE = "released"


def _gone(read) -> bool:
    try:
        read()
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_released_fleet_and_namespace_delete_without_an_operator(chart, operator_identity):
    admin = chart["client"]
    core = kubernetes.client.CoreV1Api(admin)
    fleets = kubernetes.client.CustomObjectsApi(admin)
    apps = kubernetes.client.AppsV1Api(admin)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    fleet = copy.deepcopy(yaml.safe_load(EXAMPLE_FLEET.read_text()))
    # as a running operator leaves every fleet: with kopf's finalizer on
    fleet["metadata"] = {"name": "coder", "namespace": NAMESPACE, "finalizers": [FINALIZER]}
    fleets.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, fleet)

    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(operator_identity), client_configuration=configuration)
    hook = kubernetes.client.ApiClient(configuration)  # the chart's service account, its RBAC
    deployment = f"{chart['release']}-kvfleet"
    stop_operator(hook, chart["namespace"], deployment, timeout=120)
    assert apps.read_namespaced_deployment(deployment, chart["namespace"]).spec.replicas == 0
    assert release_fleets(hook, []) == [f"{NAMESPACE}/coder"]
    assert release_fleets(hook, []) == []  # nothing left to release

    fleets.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "coder")
    wait_sync(lambda: _gone(lambda: fleets.get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, "coder")), timeout=60)  # fmt: skip
    core.delete_namespace(NAMESPACE)
    wait_sync(lambda: _gone(lambda: core.read_namespace(NAMESPACE)), timeout=120)
