"""The operator on a real API server, with the chart's RBAC: children, drift, readiness,
conflicts and garbage collection. Pods never run (no kubelet): the test fakes their status."""

from __future__ import annotations

import asyncio
import copy
import itertools
import os

import kubernetes
import pytest
import yaml
from k8s_kit import condition, make_pods_ready, wait_for
from kvfleet.operator.children import adapt_to_server, render_children
from kvfleet.operator.names import FleetRef
from kvfleet.operator.spec import parse_spec
from operator_testkit import EXAMPLE_FLEET

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)

GROUP, VERSION, PLURAL = "kvfleet.dev", "v1alpha1", "kvfleets"
# The kit's server is 1.20: no policy/v1 yet.
SERVED_1_20 = {"v1", "apps/v1", "networking.k8s.io/v1", "policy/v1beta1"}
_numbers = itertools.count(1)
TICK_SECONDS = float(os.environ["KVFLEET_OPERATOR_TICK_SECONDS"])  # set by conftest
QUIET_TICKS = 6


_PATCHES: list[tuple[str, dict]] = []


@pytest.fixture(autouse=True)
def count_operator_patches(monkeypatch):
    """Record every patch kopf sends for a fleet (its status writes)."""
    from kopf._cogs.clients import patching

    real = patching.patch_obj

    async def counting(*args, **kwargs):
        _PATCHES.append((kwargs.get("name", ""), dict(kwargs.get("patch") or {})))
        return await real(*args, **kwargs)

    monkeypatch.setattr(patching, "patch_obj", counting)


def patches_of(name: str) -> list[dict]:
    return [patch for target, patch in _PATCHES if target == name]


_CHILD_WRITES: list[str] = []


@pytest.fixture(autouse=True)
def count_child_writes(monkeypatch):
    """Record every write the operator's own client sends (children, pods, pool status)."""
    from kvfleet.operator.kube import KubeApi

    real = KubeApi._call

    def counting(self, method, path, *args, **kwargs):
        if method != "GET":
            _CHILD_WRITES.append(f"{method} {path}")
        return real(self, method, path, *args, **kwargs)

    monkeypatch.setattr(KubeApi, "_call", counting)


def child_writes_of(namespace: str) -> list[str]:
    return [write for write in _CHILD_WRITES if f"/namespaces/{namespace}/" in write]


@pytest.fixture
def api(chart):
    client = chart["client"]
    return {
        "client": client,
        "core": kubernetes.client.CoreV1Api(client),
        "apps": kubernetes.client.AppsV1Api(client),
        "custom": kubernetes.client.CustomObjectsApi(client),
        "dynamic": kubernetes.dynamic.DynamicClient(client),
    }


def example_spec() -> dict:
    spec = copy.deepcopy(yaml.safe_load(EXAMPLE_FLEET.read_text())["spec"])
    spec["autoscaling"]["enabled"] = False  # these tests drive replicas themselves
    return spec


async def new_fleet(api, spec: dict, before=None) -> tuple[str, str]:
    """A fleet in a namespace of its own; `before(namespace)` runs after the namespace exists."""
    number = next(_numbers)
    namespace, name = f"e2e-{number}", f"fleet{number}"
    api["core"].create_namespace({"metadata": {"name": namespace}})
    if before:
        before(namespace, name)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KVFleet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    api["custom"].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return namespace, name


def read_fleet(api, namespace: str, name: str) -> dict:
    return api["custom"].get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def expected_children(api, namespace: str, name: str) -> list[dict]:
    fleet = read_fleet(api, namespace, name)
    ref = FleetRef(name, namespace, fleet["metadata"]["uid"])
    spec = parse_spec(fleet["spec"])
    replicas = {pool: spec.pool(pool).replicas for pool in spec.enabled_pools()}
    return adapt_to_server(render_children(ref, spec, replicas), SERVED_1_20)


def live(api, manifest: dict, namespace: str) -> dict | None:
    resource = api["dynamic"].resources.get(
        api_version=manifest["apiVersion"], kind=manifest["kind"]
    )
    try:
        return resource.get(name=manifest["metadata"]["name"], namespace=namespace).to_dict()
    except kubernetes.dynamic.exceptions.NotFoundError:
        return None


async def all_children(api, namespace: str, name: str) -> list[dict]:
    """Every child the fleet should have, once all exist."""
    wanted = expected_children(api, namespace, name)
    return await wait_for(
        lambda: (found := [live(api, m, namespace) for m in wanted]) and all(found) and found
    )


async def test_every_child_is_created_and_owned_without_403(api, operator):
    """A missing RBAC rule or a kind the server refuses would leave a child out (or a 403)."""
    namespace, name = await new_fleet(api, example_spec())
    children = await all_children(api, namespace, name)
    uid = read_fleet(api, namespace, name)["metadata"]["uid"]
    kinds = {child["kind"] for child in children}
    assert {"Secret", "StatefulSet", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    for child in children:
        assert child["metadata"]["ownerReferences"][0]["uid"] == uid, child["metadata"]["name"]
    secret = api["core"].read_namespaced_secret(f"{name}-secret", namespace)
    assert set(secret.data) == {"fleet-secret", "redis-password"}
    assert operator.lines == []


async def test_ready_only_when_pods_are(api, operator):
    """Ready=True with no (or unready) StatefulSets misleads every rollout gate."""
    namespace, name = await new_fleet(api, example_spec())
    await all_children(api, namespace, name)
    fleet = await wait_for(lambda: condition(read_fleet(api, namespace, name), "Ready"))
    assert fleet["status"] == "False"

    def everything_ready():
        make_pods_ready(api["core"], namespace, f"kvfleet.dev/fleet={name}")
        ready = condition(read_fleet(api, namespace, name), "Ready")
        return ready and ready["status"] == "True" and ready

    ready = await wait_for(everything_ready)
    assert ready["reason"] == "Ready"
    # Settled: further ticks send no patch at all (the server would drop an equal one
    # silently, but each is still a write request per fleet per tick).
    await asyncio.sleep(2 * TICK_SECONDS)  # a tick that read the status before the last write
    sent, written = len(patches_of(name)), len(child_writes_of(namespace))
    await asyncio.sleep(QUIET_TICKS * TICK_SECONDS)
    assert patches_of(name)[sent:] == []
    # Nor any write to a child: the server's lists and canonical quantities are no drift.
    assert child_writes_of(namespace)[written:] == []
    pools = read_fleet(api, namespace, name)["status"]["pools"]
    assert pools == {
        "context": {"replicas": 1, "readyReplicas": 1},
        "generation": {"replicas": 2, "readyReplicas": 2},
    }
    assert operator.lines == []


async def test_drift_is_repaired(api, operator):
    """A deleted Service, a scaled StatefulSet and a patched image must not stay so."""
    namespace, name = await new_fleet(api, example_spec())
    await all_children(api, namespace, name)
    core, apps = api["core"], api["apps"]
    core.delete_namespaced_service(f"{name}-router", namespace, _preload_content=False)
    apps.patch_namespaced_stateful_set(f"{name}-generation", namespace, {"spec": {"replicas": 5}})
    router = apps.read_namespaced_deployment(f"{name}-router", namespace)
    original_image = router.spec.template.spec.containers[0].image
    apps.patch_namespaced_deployment(
        f"{name}-router", namespace,
        {"spec": {"template": {"spec": {"containers": [{"name": "router", "image": "evil:1"}]}}}},
    )  # fmt: skip

    def repaired():
        service = core.list_namespaced_service(
            namespace, field_selector=f"metadata.name={name}-router"
        ).items
        replicas = apps.read_namespaced_stateful_set(f"{name}-generation", namespace).spec.replicas
        image = apps.read_namespaced_deployment(f"{name}-router", namespace)
        image = image.spec.template.spec.containers[0].image
        return service and replicas == 2 and image == original_image

    await wait_for(repaired)
    assert operator.lines == []


async def test_a_name_taken_by_someone_else_is_a_conflict(api, operator):
    """An object of another owner under a child's name must be reported, and left alone."""

    def squat(namespace, name):
        api["core"].create_namespaced_config_map(
            namespace, {"metadata": {"name": f"{name}-engine"}, "data": {"mine": "yes"}}
        )

    namespace, name = await new_fleet(api, example_spec(), before=squat)

    def conflict():
        found = condition(read_fleet(api, namespace, name), "Conflict")
        return found and found["status"] == "True" and found

    found = await wait_for(conflict)
    assert f"configmaps/{name}-engine" in found["message"]
    ready = condition(read_fleet(api, namespace, name), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Conflict")
    assert api["core"].read_namespaced_config_map(f"{name}-engine", namespace).data == {
        "mine": "yes"
    }
    # The rest of the fleet is still made.
    await wait_for(
        lambda: api["apps"].read_namespaced_stateful_set(f"{name}-generation", namespace)
    )


async def test_deleting_the_fleet_deletes_its_children(api, operator):
    """A deleted fleet must leave no StatefulSet, Secret or PVC behind."""
    namespace, name = await new_fleet(api, example_spec())
    children = await all_children(api, namespace, name)
    api["custom"].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def gone():
        return all(live(api, child, namespace) is None for child in children)

    await wait_for(gone)
    assert operator.lines == []


async def test_scale_subresource_sizes_a_pool_and_drains_before_scale_in(api, operator):
    """`kubectl scale kvfleetpool` (HPA, KEDA) must size the pool through the operator: up at
    once, down only after the leaving rank was marked draining for drainSeconds."""
    spec = example_spec()
    spec["drainSeconds"] = 10  # the window in which both leaving ranks are seen draining
    namespace, name = await new_fleet(api, spec)
    await all_children(api, namespace, name)
    apps, custom, core = api["apps"], api["custom"], api["core"]
    pool = f"{name}-generation"

    def sts_replicas() -> int:
        return apps.read_namespaced_stateful_set(pool, namespace).spec.replicas

    def scale(replicas: int) -> None:
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, "kvfleetpools", pool, {"spec": {"replicas": replicas}}
        )

    scale(3)
    await wait_for(lambda: sts_replicas() == 3)
    status = await wait_for(
        lambda: custom.get_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, "kvfleetpools", pool
        )["status"]
    )
    assert status["selector"] == f"kvfleet.dev/fleet={name},kvfleet.dev/component=engine-generation"
    await wait_for(lambda: make_pods_ready(core, namespace, f"kvfleet.dev/fleet={name}") >= 5)
    scale(1)

    def draining() -> list[str]:
        pods = core.list_namespaced_pod(
            namespace, label_selector="kvfleet.dev/component=engine-generation"
        )
        return sorted(
            p.metadata.name
            for p in pods.items
            if (p.metadata.annotations or {}).get("kvfleet.dev/draining") == "true"
        )

    # The operator marks the leaving pods one patch at a time: wait for both, seen while the
    # StatefulSet still holds them (the leaving ranks still serve while they drain).
    leaving = [f"{pool}-1", f"{pool}-2"]
    assert await wait_for(lambda: draining() == leaving and sts_replicas() == 3)
    await wait_for(lambda: sts_replicas() == 1)
    assert operator.lines == []
