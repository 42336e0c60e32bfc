"""How autoscaling state is kept in a fleet's status, and the policy a spec implies per pool."""

from __future__ import annotations

from typing import Any

from .autoscale import Decision, Drain, Policy, PoolState, Targets
from .spec import FleetSpec


def policy_for(spec: FleetSpec, pool_name: str) -> Policy:
    """The autoscaling policy of one pool, from the spec."""
    scaling, bounds = spec.autoscaling, spec.bounds(pool_name)
    return Policy(
        min_replicas=bounds.min_replicas,
        max_replicas=bounds.max_replicas,
        targets=Targets(**scaling.targets.model_dump()),
        window_seconds=scaling.window_seconds,
        scale_in_below=scaling.scale_in_below,
        scale_out_cooldown_seconds=scaling.scale_out_cooldown_seconds,
        scale_in_cooldown_seconds=scaling.scale_in_cooldown_seconds,
        drain_seconds=spec.drain_seconds,
        max_step=scaling.max_step,
    )


def effective_replicas(spec: FleetSpec, status: Any) -> dict[str, int]:
    """Each enabled pool's size: the autoscaler's when it is on and has decided, else the spec's."""
    recorded = (status or {}).get("autoscaling", {}) if spec.autoscaling.enabled else {}
    return {
        name: int(recorded.get(name, {}).get("replicas", spec.pool(name).replicas))
        for name in spec.enabled_pools()
    }


def state_from_status(status: Any, pool_name: str, replicas: int) -> PoolState:
    """The PoolState recorded in status (a fresh one when none is)."""
    entry = (status or {}).get("autoscaling", {}).get(pool_name, {})
    drain = entry.get("drain")
    return PoolState(
        replicas=replicas,
        last_scale_at=entry.get("lastScaleAt"),
        drain=Drain(target_replicas=drain["targetReplicas"], since=drain["since"])
        if drain
        else None,
    )


def state_to_status(decision: Decision, now: float) -> dict[str, Any]:
    """The status entry that records a decision and the state after it."""
    state = decision.state
    drain = state.drain
    return {
        "replicas": state.replicas,
        "lastScaleAt": state.last_scale_at,
        "drain": {"targetReplicas": drain.target_replicas, "since": drain.since} if drain else None,
        "lastDecision": {"action": decision.action, "reason": decision.reason, "at": now},
    }
