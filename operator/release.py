"""Let the fleets go before the operator is uninstalled (the chart's pre-delete hook runs this).

kopf puts its finalizer (`kvfleet.dev/cleanup`) on every KVFleet it runs a timer for, and only a
running operator takes it off. Once the chart is uninstalled nothing would, so deleting a fleet,
or the namespace holding one, would hang for ever. So, in order: stop the operator (its
Deployment to 0 replicas, wait until its pods are gone, else it would put the finalizer straight
back), then take the finalizer off every fleet. The fleets and their children stay and keep
serving; deleting a fleet later removes its children through their owner references.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import kubernetes

from .names import FINALIZER, GROUP, PLURAL, VERSION


def stop_operator(client: kubernetes.client.ApiClient, namespace: str, deployment: str,
                  timeout: float) -> None:  # fmt: skip
    """Scale the operator's Deployment to 0 and wait until none of its pods is left."""
    apps, core = kubernetes.client.AppsV1Api(client), kubernetes.client.CoreV1Api(client)
    try:
        current = apps.read_namespaced_deployment(deployment, namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return
        raise
    apps.patch_namespaced_deployment(deployment, namespace, {"spec": {"replicas": 0}})
    labels = current.spec.selector.match_labels or {}
    selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
    deadline = time.monotonic() + timeout
    while core.list_namespaced_pod(namespace, label_selector=selector).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator's pods ({namespace}/{deployment}) did not stop")
        time.sleep(1)


def release_fleets(client: kubernetes.client.ApiClient, namespaces: Iterable[str]) -> list[str]:
    """Take the operator's finalizer off every KVFleet in `namespaces` (none given: every
    namespace); returns `namespace/name` of each fleet released."""
    api = kubernetes.client.CustomObjectsApi(client)
    if namespaces := list(namespaces):
        fleets = []
        for namespace in namespaces:
            fleets += api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
    else:
        fleets = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    released = []
    for fleet in fleets:
        meta = fleet["metadata"]
        finalizers = meta.get("finalizers") or []
        if FINALIZER not in finalizers:
            continue
        kept = [name for name in finalizers if name != FINALIZER]
        # the resourceVersion makes the write conditional (a conflict fails the hook's run,
        # and the Job runs it again)
        patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
        api.patch_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], patch
        )
        released.append(f"{meta['namespace']}/{meta['name']}")
    return released
