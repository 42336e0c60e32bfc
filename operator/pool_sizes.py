"""How big each pool should be now, and the drain that comes before any scale-in.

The wanted size: the built-in autoscaler's when it is on (it drains by itself), else the
pool's KVFleetPool `spec.replicas` (its scale subresource: kubectl scale, HPA, KEDA), which
follows the fleet's `pools.<pool>.replicas` whenever that changes. A wanted size below the
StatefulSet's marks the leaving ranks draining and keeps them for `drainSeconds` first
(recorded in `status.scaleIn`); a wanted size back up cancels the drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .children import CHILD_RESOURCES
from .kube import KubeApi
from .names import FleetRef
from .plan import last_applied
from .render_scaling import FROM_SPEC_ANNOTATION
from .spec import FleetSpec

POOLS = CHILD_RESOURCES[("kvfleet.dev/v1alpha1", "KVFleetPool")]
STATEFULSETS = CHILD_RESOURCES[("apps/v1", "StatefulSet")]


@dataclass
class Sizing:
    """The StatefulSet sizes to render, and what else to do about it."""

    replicas: dict[str, int]
    scale_in: dict[str, dict | None] = field(default_factory=dict)  # status.scaleIn entries
    pool_replicas: dict[str, int] = field(default_factory=dict)  # KVFleetPool spec to set
    mark: dict[str, range] = field(default_factory=dict)  # ordinals to mark draining
    unmark: dict[str, range] = field(default_factory=dict)  # ordinals whose drain is cancelled


def _wanted(spec: FleetSpec, name: str, pool: dict | None, autoscaled: int | None) -> int:
    if autoscaled is not None:
        return autoscaled
    from_spec = spec.pool(name).replicas
    if pool and pool["metadata"].get("annotations", {}).get(FROM_SPEC_ANNOTATION) == str(from_spec):
        return int(pool.get("spec", {}).get("replicas", from_spec))
    return from_spec  # a new pool, or the fleet's own count changed: it wins once


def size_pools(
    kube: KubeApi,
    fleet: FleetRef,
    spec: FleetSpec,
    status: Any,
    autoscaled: dict[str, int] | None,
    now: float,
) -> Sizing:
    """Each pool's size this pass; `autoscaled` is the autoscaler's (None when it is off)."""
    sizing = Sizing(replicas={})
    recorded = (status or {}).get("scaleIn") or {}
    for name in spec.enabled_pools():
        pool = kube.get(POOLS, fleet.namespace, fleet.child_name(name))
        wanted = _wanted(spec, name, pool, autoscaled and autoscaled[name])
        if pool is not None and int(pool.get("spec", {}).get("replicas", -1)) != wanted:
            sizing.pool_replicas[name] = wanted
        statefulset = kube.get(STATEFULSETS, fleet.namespace, fleet.child_name(name))
        # The size the operator itself last gave the pool: a StatefulSet scaled by hand is
        # drift (put back), not a pool to drain.
        applied = last_applied(statefulset) if statefulset else None
        current = int(((applied or statefulset or {}).get("spec") or {}).get("replicas", wanted))
        drain = recorded.get(name)
        if autoscaled is not None or wanted >= current:
            sizing.replicas[name] = wanted
            if drain:  # load came back or the size went up: the leaving ranks stay
                sizing.unmark[name] = range(drain["targetReplicas"], current)
                sizing.scale_in[name] = None
            continue
        if (
            drain
            and drain["targetReplicas"] == wanted
            and now - drain["since"] >= spec.drain_seconds
        ):
            sizing.replicas[name] = wanted  # drained: now the StatefulSet shrinks
            sizing.scale_in[name] = None
            continue
        sizing.replicas[name] = current
        if not drain or drain["targetReplicas"] != wanted:
            sizing.mark[name] = range(wanted, current)
            if drain and drain["targetReplicas"] < wanted:
                sizing.unmark[name] = range(drain["targetReplicas"], wanted)
            sizing.scale_in[name] = {"targetReplicas": wanted, "since": now}
    return sizing
