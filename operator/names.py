"""Names, labels and owner references of a fleet's children (one place, so nothing drifts)."""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "kvfleet.dev"
VERSION = "v1alpha1"
KIND = "KVFleet"
PLURAL = "kvfleets"
API_VERSION = f"{GROUP}/{VERSION}"
# kopf's finalizer on every fleet the operator runs (its timer needs one); operator/release.py
# takes it off before an uninstall.
FINALIZER = f"{GROUP}/cleanup"

FLEET_LABEL = f"{GROUP}/fleet"
COMPONENT_LABEL = f"{GROUP}/component"
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
DRAINING_ANNOTATION = f"{GROUP}/draining"

# Kubernetes object names and label values stop at 63 characters (DNS-1123 label).
MAX_NAME = 63


@dataclass(frozen=True)
class FleetRef:
    """The identity of one fleet object: what its children are named after and owned by."""

    name: str
    namespace: str
    uid: str

    def child_name(self, suffix: str) -> str:
        """`<fleet>-<suffix>` cut to 63 characters (the fleet part is cut, the suffix kept)."""
        head = self.name[: MAX_NAME - len(suffix) - 1].rstrip("-")
        return f"{head}-{suffix}"

    def labels(self, component: str) -> dict[str, str]:
        """Labels of every child of `component`; also its selector (no version in it)."""
        return {
            "app.kubernetes.io/name": "kvfleet",
            "app.kubernetes.io/instance": self.name[:MAX_NAME],
            "app.kubernetes.io/managed-by": "kvfleet-operator",
            FLEET_LABEL: self.name[:MAX_NAME],
            COMPONENT_LABEL: component,
        }

    def selector(self, component: str) -> dict[str, str]:
        """Selector labels of `component`: a stable subset that never changes after creation."""
        return {FLEET_LABEL: self.name[:MAX_NAME], COMPONENT_LABEL: component}

    def owner_reference(self) -> dict[str, object]:
        """The controller owner reference that lets Kubernetes garbage-collect a child."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, suffix: str, component: str) -> dict[str, object]:
        """Metadata of a child: name, namespace, labels, owner reference."""
        return {
            "name": self.child_name(suffix),
            "namespace": self.namespace,
            "labels": self.labels(component),
            "ownerReferences": [self.owner_reference()],
        }

    def router_address(self, grpc_port: int) -> str:
        """The address engines and clients use to reach the router Service."""
        return f"{self.child_name('router')}:{grpc_port}"

    def redis_url(self) -> str:
        """The URL of the managed Redis Service (its password reaches the router apart)."""
        return f"redis://{self.child_name('redis')}:6379/0"
