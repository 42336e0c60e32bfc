"""A fleet's readiness, from the live objects only. Ready is False while a child is missing,
a workload's controller has not seen its latest spec, a rollout is under way (pods of the old
template still serve), a workload is short of ready pods, or an engine pool (a StatefulSet:
only enabled pools have one) has no ready pod at all, even when scaled to 0 on purpose: a
fleet without one of its pools cannot serve. Never "all ready" on nothing."""

from __future__ import annotations

from dataclasses import dataclass

from .children import CHILD_RESOURCES, resource_of
from .kube import KubeApi
from .names import FleetRef
from .pool_sizes import POOLS, Sizing
from .reconcile import Outcome
from .spec import FleetSpec

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
STATEFULSETS = CHILD_RESOURCES[("apps/v1", "StatefulSet")]


@dataclass(frozen=True)
class PoolReport:
    """A pool's size as its live StatefulSet reports it (0/0 when it does not exist)."""

    replicas: int
    ready_replicas: int

    def as_status(self) -> dict[str, int]:
        return {"replicas": self.replicas, "readyReplicas": self.ready_replicas}


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Gap:
    """Why one workload is not ready; `empty`: an engine pool with no pod wanted at all."""

    message: str
    empty: bool = False


def _rollout_gap(kind: str, wanted: int, status: dict) -> str | None:
    """A rollout under way: pods not yet on the newest template, or (StatefulSets) the
    controller's current revision not yet the update revision."""
    updated = int(status.get("updatedReplicas", 0))
    if updated < wanted:
        return f"rolling out ({updated}/{wanted} updated)"
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if kind == "StatefulSet" and current != update:
        return f"rolling out (revision {current} -> {update})"
    return None


def workload_gap(kind: str, live: dict) -> Gap | None:
    """Why a live Deployment/StatefulSet is not ready, or None when it is."""
    meta, spec, status = live["metadata"], live.get("spec", {}), live.get("status", {})
    if status.get("observedGeneration", 0) < meta.get("generation", 1):
        return Gap("not yet observed")
    wanted, ready = int(spec.get("replicas", 1)), int(status.get("readyReplicas", 0))
    rollout = _rollout_gap(kind, wanted, status)
    if rollout:
        return Gap(rollout)
    if ready < wanted:
        return Gap(f"{ready}/{wanted} ready")
    if kind == "StatefulSet" and ready == 0:
        return Gap("has no replica (scaled to 0)", empty=True)
    return None


def pool_reports(fleet: FleetRef, spec: FleetSpec, outcome: Outcome) -> dict[str, PoolReport]:
    """Replicas and ready replicas of every enabled pool, from the live StatefulSets."""
    by_name = {name: obj for (res, name), obj in outcome.live.items() if res == STATEFULSETS}
    reports = {}
    for pool in spec.enabled_pools():
        live = by_name.get(fleet.child_name(pool), {})
        reports[pool] = PoolReport(
            replicas=int(live.get("spec", {}).get("replicas", 0)),
            ready_replicas=int(live.get("status", {}).get("readyReplicas", 0)),
        )
    return reports


def readiness(outcome: Outcome) -> Readiness:
    """Ready only when every desired child exists and every workload has its pods ready."""
    if outcome.conflicts:
        return Readiness(False, "Conflict", "; ".join(outcome.conflicts))
    missing, waiting, empty = [], [], []
    for manifest in outcome.desired:
        name = manifest["metadata"]["name"]
        live = outcome.live.get((resource_of(manifest), name))
        label = f"{manifest['kind']}/{name}"
        if live is None:
            missing.append(label)
        elif manifest["kind"] in WORKLOAD_KINDS:
            gap = workload_gap(manifest["kind"], live)
            if gap:
                (empty if gap.empty else waiting).append(f"{label} {gap.message}")
    if missing:
        return Readiness(False, "Progressing", "missing " + ", ".join(missing))
    if waiting:
        return Readiness(False, "Progressing", "waiting for " + ", ".join(waiting))
    if empty:
        return Readiness(False, "PoolEmpty", ", ".join(empty))
    return Readiness(True, "Ready", "every child exists and every pod is ready")


def report_pool_objects(
    kube: KubeApi, fleet: FleetRef, spec: FleetSpec, outcome: Outcome, sizing: Sizing
) -> None:
    """Each KVFleetPool's spec (when the fleet or the autoscaler set a new size) and its status
    (the StatefulSet's size now, and the pods' selector for HPA/KEDA), written on change."""
    reports = pool_reports(fleet, spec, outcome)
    for name in spec.enabled_pools():
        live = outcome.live.get((POOLS, fleet.child_name(name)))
        if live is None:
            continue  # not there yet (or the name is taken: a Conflict)
        if name in sizing.pool_replicas:
            kube.patch(POOLS, fleet.namespace, fleet.child_name(name),
                       {"spec": {"replicas": sizing.pool_replicas[name]}})  # fmt: skip
        selector = ",".join(f"{k}={v}" for k, v in fleet.selector(f"engine-{name}").items())
        report = reports[name]
        status = {
            "replicas": report.replicas,
            "readyReplicas": report.ready_replicas,
            "selector": selector,
        }
        if live.get("status") != status:
            kube.patch_status(POOLS, fleet.namespace, fleet.child_name(name), {"status": status})
