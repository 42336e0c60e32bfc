"""Helpers of the API-server suite: apply the rendered chart, play kubelet, wait on objects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import kubernetes
from chart_tools import documents, helm
from operator_testkit import CHART_DIR

WAIT_SECONDS = 120.0  # only a failure waits this long; a loaded CI machine just takes longer


def admin_client(cluster: dict[str, str]) -> kubernetes.client.ApiClient:
    """An API client with the kit's admin (system:masters) identity."""
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        cluster["KVFLEET_K8S_ADMIN_KUBECONFIG"], client_configuration=configuration
    )
    return kubernetes.client.ApiClient(configuration)


def create_objects(client: kubernetes.client.ApiClient, objects: list[dict]) -> None:
    """Create each object (`kubectl create -f`, through the Python client's discovery, so
    custom kinds work too)."""
    dynamic = kubernetes.dynamic.DynamicClient(client)
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.create(body=obj, namespace=obj["metadata"].get("namespace"))


def apply_chart(client: kubernetes.client.ApiClient, release: str, namespace: str) -> list[dict]:
    """`helm template --include-crds | kubectl apply` into a fresh namespace; wait for the CRD."""
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespace({"metadata": {"name": namespace}})
    rendered = documents(
        helm("template", release, str(CHART_DIR), "--namespace", namespace, "--include-crds")
    )
    crds = [obj for obj in rendered if obj["kind"] == "CustomResourceDefinition"]
    create_objects(client, crds)
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    for crd in crds:
        wait_sync(lambda name=crd["metadata"]["name"]: _established(extensions, name))
    create_objects(client, [obj for obj in rendered if obj not in crds])
    return rendered


def _established(extensions, name: str) -> bool:
    crd = extensions.read_custom_resource_definition(name)
    conditions = crd.status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def wait_sync(check: Callable[[], Any], timeout: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout}s")


async def wait_for(check: Callable[[], Any], timeout: float = WAIT_SECONDS) -> Any:
    """Poll `check` (run in a thread: the client blocks) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = await asyncio.to_thread(check)
            if result:
                return result
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


def make_pods_ready(core: kubernetes.client.CoreV1Api, namespace: str, selector: str) -> int:
    """Play kubelet: every pod the selector matches is Running and Ready (pods/status)."""
    ready = {
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.2",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    for pod in pods:
        core.patch_namespaced_pod_status(pod.metadata.name, namespace, ready)
    return len(pods)


def condition(fleet: dict, type_: str) -> dict | None:
    conditions = (fleet.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)
