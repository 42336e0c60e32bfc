"""Bring a fleet's children in line with its spec, and report what the pools look like."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .children import CHILD_RESOURCES, PODS, Resource, render_children
from .kube import KubeApi
from .names import DRAINING_ANNOTATION, FLEET_LABEL, FleetRef
from .plan import ChildAction, plan_children
from .spec import FleetSpec

STATEFULSETS = CHILD_RESOURCES[("apps/v1", "StatefulSet")]


@dataclass(frozen=True)
class PoolReport:
    """A pool's size as the StatefulSet reports it."""

    replicas: int
    ready_replicas: int

    def as_status(self) -> dict[str, int]:
        return {"replicas": self.replicas, "readyReplicas": self.ready_replicas}


def live_children(kube: KubeApi, fleet: FleetRef) -> dict[tuple[Resource, str], dict]:
    """Every live child of `fleet` (by label and owner uid), keyed by (resource, name)."""
    found: dict[tuple[Resource, str], dict] = {}
    for resource in CHILD_RESOURCES.values():
        for item in kube.list(resource, fleet.namespace, {FLEET_LABEL: fleet.name[:63]}):
            owners = item.get("metadata", {}).get("ownerReferences", [])
            if any(owner.get("uid") == fleet.uid for owner in owners):
                found[(resource, item["metadata"]["name"])] = item
    return found


def apply_actions(
    kube: KubeApi, namespace: str, actions: list[ChildAction], logger: logging.Logger
) -> None:
    """Send each planned call, in order."""
    for action in actions:
        logger.info("%s %s", action.verb, action.kind_name)
        if action.verb == "create":
            kube.create(action.resource, namespace, action.body or {})
        elif action.verb == "patch":
            kube.patch(action.resource, namespace, action.name, action.body or {})
        else:
            kube.delete(action.resource, namespace, action.name)


def reconcile(
    kube: KubeApi,
    fleet: FleetRef,
    spec: FleetSpec,
    replicas: dict[str, int],
    logger: logging.Logger,
) -> list[ChildAction]:
    """Create, patch and delete children so they match the spec; return what was done."""
    desired = render_children(fleet, spec, replicas)
    actions = plan_children(desired, live_children(kube, fleet))
    apply_actions(kube, fleet.namespace, actions, logger)
    return actions


def delete_children(kube: KubeApi, fleet: FleetRef, logger: logging.Logger) -> list[ChildAction]:
    """Delete every child of the fleet (owner references would too; this does not wait for GC)."""
    actions = plan_children([], live_children(kube, fleet))
    apply_actions(kube, fleet.namespace, actions, logger)
    return actions


def pool_reports(kube: KubeApi, fleet: FleetRef, spec: FleetSpec) -> dict[str, PoolReport]:
    """Replicas and ready replicas of every enabled pool (0 ready until the StatefulSet says)."""
    reports = {}
    for name in spec.enabled_pools():
        live = kube.get(STATEFULSETS, fleet.namespace, fleet.child_name(name)) or {}
        reports[name] = PoolReport(
            replicas=int(live.get("spec", {}).get("replicas", 0)),
            ready_replicas=int(live.get("status", {}).get("readyReplicas", 0)),
        )
    return reports


def rank_names(fleet: FleetRef, pool_name: str, ordinals: range) -> list[str]:
    """Pod names (the rank ids) of a pool's StatefulSet ordinals."""
    return [f"{fleet.child_name(pool_name)}-{ordinal}" for ordinal in ordinals]


def mark_draining(kube: KubeApi, fleet: FleetRef, ranks: list[str], draining: bool) -> list[str]:
    """Set or clear the drain annotation on rank pods; return the ranks that exist."""
    value: Any = "true" if draining else None
    patch = {"metadata": {"annotations": {DRAINING_ANNOTATION: value}}}
    return [rank for rank in ranks if kube.patch(PODS, fleet.namespace, rank, patch) is not None]
