"""Bring a fleet's children in line with its spec, and mark ranks that are leaving."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from .children import CHILD_RESOURCES, PODS, Resource, adapt_to_server, render_children
from .kube import KubeApi
from .names import DRAINING_ANNOTATION, FLEET_LABEL, FleetRef
from .plan import ChildAction, plan_children
from .spec import FleetSpec

STATEFULSETS = CHILD_RESOURCES[("apps/v1", "StatefulSet")]


@dataclass
class Outcome:
    """What one pass did: the calls sent, the children it could not take (someone else's
    object has the name), and the live children it saw afterwards."""

    actions: list[ChildAction] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    live: dict[tuple[Resource, str], dict] = field(default_factory=dict)
    desired: list[dict] = field(default_factory=list)


def live_children(kube: KubeApi, fleet: FleetRef) -> dict[tuple[Resource, str], dict]:
    """Every live child of `fleet` (by label and owner uid), keyed by (resource, name).

    A real API server leaves `apiVersion` and `kind` out of list items (the list names them
    once); they are put back, as kubectl does, or every child would differ from its manifest.
    """
    found: dict[tuple[Resource, str], dict] = {}
    for (api_version, kind), resource in CHILD_RESOURCES.items():
        for item in kube.list(resource, fleet.namespace, {FLEET_LABEL: fleet.name[:63]}):
            owners = item.get("metadata", {}).get("ownerReferences", [])
            if any(owner.get("uid") == fleet.uid for owner in owners):
                typed = {**item, "apiVersion": api_version, "kind": kind}
                found[(resource, item["metadata"]["name"])] = typed
    return found


def _taken_by_other(kube: KubeApi, action: ChildAction, fleet: FleetRef) -> str | None:
    """Who holds the name a create found taken, for the Conflict message; None when it is
    this fleet itself (a concurrent pass created it first)."""
    other = kube.get(action.resource, fleet.namespace, action.name) or {}
    owners = other.get("metadata", {}).get("ownerReferences", [])
    if any(owner.get("uid") == fleet.uid for owner in owners):
        return None
    holder = ", ".join(f"{o.get('kind')}/{o.get('name')}" for o in owners) or "no owner"
    return f"{action.kind_name} exists and is not this fleet's ({holder})"


def apply_actions(
    kube: KubeApi, fleet: FleetRef, actions: list[ChildAction], logger: logging.Logger
) -> tuple[list[ChildAction], list[str]]:
    """Send each planned call, in order; a create whose name is taken is a conflict, not a
    retry (the other object is never touched). Returns (calls done, conflicts)."""
    done, conflicts = [], []
    for action in actions:
        logger.info("%s %s", action.verb, action.kind_name)
        if action.verb == "create":
            try:
                kube.create(action.resource, fleet.namespace, action.body or {})
            except kubernetes.client.ApiException as exc:
                if exc.status != 409:
                    raise
                holder = _taken_by_other(kube, action, fleet)
                if holder:
                    conflicts.append(holder)
                continue
        elif action.verb == "patch":
            kube.patch(action.resource, fleet.namespace, action.name, action.body or {})
        else:
            kube.delete(action.resource, fleet.namespace, action.name)
        done.append(action)
    return done, conflicts


def desired_children(
    kube: KubeApi, fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]
) -> list[dict]:
    """The children as this server can take them."""
    return adapt_to_server(render_children(fleet, spec, replicas), kube.served())


def reconcile(
    kube: KubeApi,
    fleet: FleetRef,
    spec: FleetSpec,
    replicas: dict[str, int],
    logger: logging.Logger,
) -> Outcome:
    """Create, patch and delete children so the live ones match the spec."""
    desired = desired_children(kube, fleet, spec, replicas)
    live = live_children(kube, fleet)
    actions, conflicts = apply_actions(kube, fleet, plan_children(desired, live), logger)
    if actions:
        live = live_children(kube, fleet)
    return Outcome(actions=actions, conflicts=conflicts, live=live, desired=desired)


def delete_children(kube: KubeApi, fleet: FleetRef, logger: logging.Logger) -> list[ChildAction]:
    """Delete every child of the fleet (owner references would too; this does not wait for GC)."""
    actions = plan_children([], live_children(kube, fleet))
    done, _ = apply_actions(kube, fleet, actions, logger)
    return done


def rank_names(fleet: FleetRef, pool_name: str, ordinals: range) -> list[str]:
    """Pod names (the rank ids) of a pool's StatefulSet ordinals."""
    return [f"{fleet.child_name(pool_name)}-{ordinal}" for ordinal in ordinals]


def mark_draining(kube: KubeApi, fleet: FleetRef, ranks: list[str], draining: bool) -> list[str]:
    """Set or clear the drain annotation on rank pods; return the ranks that exist."""
    value: Any = "true" if draining else None
    patch = {"metadata": {"annotations": {DRAINING_ANNOTATION: value}}}
    return [rank for rank in ranks if kube.patch(PODS, fleet.namespace, rank, patch) is not None]
