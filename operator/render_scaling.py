"""A KVFleetPool per engine pool: the object whose scale subresource (`kubectl scale`, HPA,
KEDA) sizes the pool. Its `spec.replicas` belongs to whoever scales it; the operator sets it
only when the fleet's own `pools.<pool>.replicas` changes (or the built-in autoscaler acts),
and records which fleet value it last took in an annotation."""

from __future__ import annotations

from .names import API_VERSION, GROUP, FleetRef
from .spec import FleetSpec

POOL_KIND = "KVFleetPool"
FROM_SPEC_ANNOTATION = f"{GROUP}/replicas-from-spec"
# Fields of a child that others own after its creation: never compared, never patched back.
SCALER_OWNED = {(API_VERSION, POOL_KIND): ("spec", "replicas")}


def render_pool_scalers(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """One KVFleetPool `<fleet>-<pool>` per enabled pool, created at the pool's size now."""
    children = []
    for name in spec.enabled_pools():
        metadata = fleet.metadata(name, f"engine-{name}")
        metadata["annotations"] = {FROM_SPEC_ANNOTATION: str(spec.pool(name).replicas)}
        children.append(
            {
                "apiVersion": API_VERSION,
                "kind": POOL_KIND,
                "metadata": metadata,
                "spec": {"replicas": replicas[name]},
            }
        )
    return children


def without_scaler_owned(manifest: dict) -> dict:
    """The manifest less the fields its scalers own (for comparing and patching)."""
    owned = SCALER_OWNED.get((manifest.get("apiVersion"), manifest.get("kind")))
    if not owned:
        return manifest
    section, key = owned
    return {**manifest, section: {k: v for k, v in manifest.get(section, {}).items() if k != key}}
