"""What a fleet consists of: a small registry of child renderers and the resources they make."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .names import FleetRef
from .render_config import render_engine_configmap
from .render_policies import render_disruption_budgets, render_network_policies
from .render_pools import render_pools
from .render_router import render_router
from .render_scaling import render_pool_scalers
from .render_secret import render_fleet_secret
from .render_storage import render_disk_tier, render_managed_redis
from .spec import FleetSpec

Renderer = Callable[[FleetRef, FleetSpec, dict[str, int]], list[dict]]


@dataclass(frozen=True)
class Resource:
    """An API resource as its URL spells it: group ('' for core), version, plural."""

    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str) -> str:
        """URL path of the namespaced collection (POST and LIST)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        """URL path of one object (GET, PATCH, DELETE)."""
        return f"{self.collection_path(namespace)}/{name}"


# Every kind a fleet may own, keyed as its manifests spell it; deletion sweeps exactly these.
CHILD_RESOURCES: dict[tuple[str, str], Resource] = {
    ("v1", "Secret"): Resource("", "v1", "secrets"),
    ("v1", "ConfigMap"): Resource("", "v1", "configmaps"),
    ("v1", "PersistentVolumeClaim"): Resource("", "v1", "persistentvolumeclaims"),
    ("v1", "Service"): Resource("", "v1", "services"),
    ("apps/v1", "Deployment"): Resource("apps", "v1", "deployments"),
    ("apps/v1", "StatefulSet"): Resource("apps", "v1", "statefulsets"),
    ("kvfleet.dev/v1alpha1", "KVFleetPool"): Resource("kvfleet.dev", "v1alpha1", "kvfleetpools"),
    ("networking.k8s.io/v1", "NetworkPolicy"): Resource(
        "networking.k8s.io", "v1", "networkpolicies"
    ),
    ("policy/v1", "PodDisruptionBudget"): Resource("policy", "v1", "poddisruptionbudgets"),
    # Servers before 1.21 have only the beta PodDisruptionBudget (see adapt_to_server).
    ("policy/v1beta1", "PodDisruptionBudget"): Resource(
        "policy", "v1beta1", "poddisruptionbudgets"
    ),
}
PODS = Resource("", "v1", "pods")

# In creation order: the secret, config and storage before the pods that mount them, Redis
# before the router.
RENDERERS: tuple[Renderer, ...] = (
    render_fleet_secret,
    render_engine_configmap,
    render_disk_tier,
    render_managed_redis,
    render_router,
    render_pools,
    render_pool_scalers,
    render_network_policies,
    render_disruption_budgets,
)


def resource_of(manifest: dict) -> Resource:
    """The API resource a child manifest belongs to."""
    key = (manifest["apiVersion"], manifest["kind"])
    if key not in CHILD_RESOURCES:
        raise ValueError(f"{key} is not a fleet child kind; known: {sorted(CHILD_RESOURCES)}")
    return CHILD_RESOURCES[key]


def render_children(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """Every child of a fleet, in creation order; `replicas` gives each enabled pool's size."""
    missing = [name for name in spec.enabled_pools() if name not in replicas]
    if missing:
        raise ValueError(f"no replica count for pools {missing}; got {sorted(replicas)}")
    children: list[dict] = []
    for renderer in RENDERERS:
        children.extend(renderer(fleet, spec, replicas))
    return children


def adapt_to_server(children: list[dict], served: set[str]) -> list[dict]:
    """The children as this API server can take them: `served` holds its group/versions; a
    server without policy/v1 (before 1.21) gets the beta PodDisruptionBudget (same fields)."""
    if "policy/v1" in served or "policy/v1beta1" not in served:
        return children
    return [
        {**child, "apiVersion": "policy/v1beta1"}
        if (child["apiVersion"], child["kind"]) == ("policy/v1", "PodDisruptionBudget")
        else child
        for child in children
    ]
