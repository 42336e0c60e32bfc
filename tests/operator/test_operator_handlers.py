"""The operator end to end against kmock: create, update, delete, invalid spec."""

from __future__ import annotations

import copy

import httpx
import yaml
from kvfleet.operator.children import CHILD_RESOURCES
from kvfleet.operator.names import CONFIG_HASH_ANNOTATION
from operator_testkit import FLEETS, NAMESPACE, eventually

CHILD_PLURALS = {resource.plural for resource in CHILD_RESOURCES.values()}
STS = "apps/v1/statefulsets"
DEPLOY = "apps/v1/deployments"
BASE_SPEC = {
    "model": {"name": "tiny", "path": "/models/tiny"},
    "pools": {"context": {"replicas": 1}, "generation": {"replicas": 2}},
}


def fleet_body(name: str, spec: dict, uid: str = "uid-1") -> dict:
    return {
        "apiVersion": "kvfleet.dev/v1alpha1",
        "kind": "KVFleet",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid,
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": spec,
    }


async def send(k8s, method: str, path: str, body: dict | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with httpx.AsyncClient(base_url=str(k8s.url), timeout=10) as client:
        response = await client.request(method, path, json=body, headers=headers)
    response.raise_for_status()
    return response


FLEET_PATH = f"/apis/kvfleet.dev/v1alpha1/namespaces/{NAMESPACE}/kvfleets"


def live(k8s, resource: str, name: str) -> dict | None:
    try:
        obj = k8s.objects[resource, NAMESPACE, name]
    except KeyError:
        return None
    return None if obj.deleted else obj.raw


def check_children_owned(k8s, fleet: str, uid: str) -> None:
    """Integrity: every child the operator made is owned by the fleet and labelled with it."""
    for (resource, _, name), obj in k8s.objects.items():
        if obj.deleted or resource.plural not in CHILD_PLURALS:
            continue
        meta = obj.raw["metadata"]
        assert meta["labels"]["kvfleet.dev/fleet"] == fleet, name
        assert meta["ownerReferences"][0]["uid"] == uid, name


async def test_create_makes_every_child(k8s, operator):
    """Creating a fleet must bring up router, both pools, PVC, Redis and the engine ConfigMap."""
    await send(k8s, "POST", FLEET_PATH, fleet_body("f1", BASE_SPEC))
    await eventually(lambda: live(k8s, STS, "f1-generation"))
    await eventually(lambda: live(k8s, FLEETS, "f1")["status"].get("observedGeneration") == 1)
    expected = {
        ("v1/configmaps", "f1-engine"), ("v1/persistentvolumeclaims", "f1-disk"),
        (DEPLOY, "f1-redis"), ("v1/services", "f1-redis"), (DEPLOY, "f1-router"),
        ("v1/services", "f1-router"), (STS, "f1-context"), ("v1/services", "f1-context"),
        (STS, "f1-generation"), ("v1/services", "f1-generation"),
    }  # fmt: skip
    assert all(live(k8s, resource, name) for resource, name in expected)
    generation = live(k8s, STS, "f1-generation")
    assert generation["spec"]["replicas"] == 2
    args = generation["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[2:4] == ["--role", "generation"]
    assert live(k8s, FLEETS, "f1")["metadata"]["finalizers"] == ["kvfleet.dev/cleanup"]
    check_children_owned(k8s, "f1", "uid-1")


async def test_scaling_a_pool_patches_only_that_statefulset(k8s, operator):
    """Changing one pool's replicas must send one PATCH (to that pool) and touch nothing else."""
    await send(k8s, "POST", FLEET_PATH, fleet_body("f2", BASE_SPEC, uid="uid-2"))
    await eventually(lambda: live(k8s, FLEETS, "f2")["status"].get("observedGeneration") == 1)
    before = len(list(k8s["patch"]))
    spec = copy.deepcopy(BASE_SPEC)
    spec["pools"]["generation"]["replicas"] = 5
    await send(k8s, "PATCH", f"{FLEET_PATH}/f2", {"metadata": {"generation": 2}, "spec": spec})
    await eventually(lambda: live(k8s, STS, "f2-generation")["spec"]["replicas"] == 5)
    pools = "kvfleet.dev/v1alpha1/kvfleetpools"
    await eventually(lambda: live(k8s, pools, "f2-generation")["spec"]["replicas"] == 5)
    patched = [(r.resource.plural, r.name) for r in list(k8s["patch"])[before:]]
    child_patches = [(plural, name) for plural, name in patched if plural != "kvfleets"]
    # (the timer may converge the same change too: still that pool only), and the pool's
    # KVFleetPool follows the fleet's new size (its scale subresource)
    assert set(child_patches) == {
        ("statefulsets", "f2-generation"),
        ("kvfleetpools", "f2-generation"),
    }
    assert live(k8s, STS, "f2-context")["spec"]["replicas"] == 1
    check_children_owned(k8s, "f2", "uid-2")


async def test_routing_change_updates_router_args(k8s, operator):
    """Switching to lenient affinity must reach the router's command line."""
    await send(k8s, "POST", FLEET_PATH, fleet_body("f3", BASE_SPEC, uid="uid-3"))
    await eventually(lambda: live(k8s, DEPLOY, "f3-router"))
    spec = {**copy.deepcopy(BASE_SPEC), "routing": {"affinity": "lenient", "maxWaitPasses": 3}}
    await send(k8s, "PATCH", f"{FLEET_PATH}/f3", {"metadata": {"generation": 2}, "spec": spec})

    def router_args():
        return live(k8s, DEPLOY, "f3-router")["spec"]["template"]["spec"]["containers"][0]["args"]

    await eventually(lambda: "lenient" in router_args())
    args = router_args()
    assert args[args.index("--max-wait-passes") + 1] == "3"


async def test_reuse_change_updates_engine_yaml_and_rolls_the_pool(k8s, operator):
    """keepRoot/keepBranchPoints must reach the ConfigMap and change the pods' config hash."""
    await send(k8s, "POST", FLEET_PATH, fleet_body("f6", BASE_SPEC, uid="uid-6"))
    await eventually(lambda: live(k8s, FLEETS, "f6")["status"].get("observedGeneration") == 1)

    def reuse() -> dict:
        data = live(k8s, "v1/configmaps", "f6-engine")["data"]
        return yaml.safe_load(data["generation.yaml"])["reuse"]

    def pod_hash() -> str:
        template = live(k8s, STS, "f6-generation")["spec"]["template"]
        return template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]

    assert (reuse()["keep_root"], reuse()["keep_branch_points"]) == (False, 2)
    hash_before = pod_hash()
    spec = {**copy.deepcopy(BASE_SPEC), "reuse": {"keepRoot": True, "keepBranchPoints": 1}}
    await send(k8s, "PATCH", f"{FLEET_PATH}/f6", {"metadata": {"generation": 2}, "spec": spec})
    await eventually(lambda: reuse()["keep_branch_points"] == 1)
    assert reuse()["keep_root"] is True
    await eventually(lambda: pod_hash() != hash_before)
    check_children_owned(k8s, "f6", "uid-6")


async def test_delete_removes_children_and_finalizer(k8s, operator):
    """Deleting a fleet must delete its children and release the finalizer so the fleet goes."""
    await send(k8s, "POST", FLEET_PATH, fleet_body("f4", BASE_SPEC, uid="uid-4"))
    await eventually(lambda: live(k8s, FLEETS, "f4").get("metadata", {}).get("finalizers"))
    await eventually(lambda: live(k8s, STS, "f4-generation"))
    await send(k8s, "DELETE", f"{FLEET_PATH}/f4")
    await eventually(lambda: live(k8s, FLEETS, "f4") is None)
    assert live(k8s, STS, "f4-generation") is None
    assert live(k8s, DEPLOY, "f4-router") is None
    assert live(k8s, "v1/persistentvolumeclaims", "f4-disk") is None


async def test_invalid_spec_becomes_a_condition(k8s, operator):
    """A spec the operator cannot run must be reported as a False condition, with no children."""
    bounds = {"generation": {"minReplicas": 5, "maxReplicas": 2}}
    spec = {**copy.deepcopy(BASE_SPEC), "autoscaling": bounds}
    await send(k8s, "POST", FLEET_PATH, fleet_body("f5", spec, uid="uid-5"))

    def spec_valid():
        conditions = live(k8s, FLEETS, "f5").get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "SpecValid"), None)

    condition = await eventually(spec_valid)
    assert condition["status"] == "False"
    assert condition["reason"] == "InvalidSpec"
    assert "minReplicas=5 > maxReplicas=2" in condition["message"]
    assert live(k8s, STS, "f5-generation") is None
    assert not operator.done()


async def test_a_deleted_child_comes_back_within_a_tick(k8s, operator):
    """Drift must be repaired by the timer, without waiting for the next spec edit."""
    await send(k8s, "POST", FLEET_PATH, fleet_body("f8", BASE_SPEC, uid="uid-8"))
    await eventually(lambda: live(k8s, "v1/services", "f8-router"))
    await send(k8s, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/f8-router")
    await eventually(lambda: live(k8s, "v1/services", "f8-router") is None)
    await eventually(lambda: live(k8s, "v1/services", "f8-router"))
