"""Helpers for kmock tests of a whole fleet: play the workload controllers, read conditions."""

from __future__ import annotations

from operator_testkit import FLEETS, NAMESPACE
from test_operator_handlers import DEPLOY, STS, live, send

WORKLOADS = {STS: "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}",
             DEPLOY: "/apis/apps/v1/namespaces/{ns}/deployments/{name}"}  # fmt: skip


def ready_status(replicas: int) -> dict:
    """A workload's status once its controller has rolled out every pod and all are ready."""
    return {
        "observedGeneration": 1,
        "replicas": replicas,
        "readyReplicas": replicas,
        "updatedReplicas": replicas,
        "availableReplicas": replicas,
        "currentRevision": "rev-1",
        "updateRevision": "rev-1",
    }


async def mark_workloads_ready(k8s, fleet: str) -> None:
    """Play the Deployment and StatefulSet controllers: every workload of `fleet` is ready."""
    for (resource, namespace, name), obj in list(k8s.objects.items()):
        key = f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/")
        if key not in WORKLOADS or namespace != NAMESPACE or obj.deleted:
            continue
        if obj.raw["metadata"]["labels"].get("kvfleet.dev/fleet") != fleet:
            continue
        replicas = int(obj.raw["spec"].get("replicas", 1))
        path = WORKLOADS[key].format(ns=NAMESPACE, name=name)
        await send(k8s, "PATCH", path, {"status": ready_status(replicas)})


def condition(k8s, fleet: str, type_: str) -> dict | None:
    """The fleet's condition of this type, or None."""
    conditions = (live(k8s, FLEETS, fleet) or {}).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), None)


def writes(requests: list) -> list[str]:
    """`METHOD plural/name {body}` of every request that would change something on the server."""
    return [
        f"{r.method.value} {r.resource.plural if r.resource else r.path}/{r.name} {r.data}"
        for r in requests
        if r.method.value in ("POST", "PUT", "PATCH", "DELETE")
    ]
