"""Who may reach whom, and how many pods a voluntary disruption may take at once.

NetworkPolicies: only the fleet's routers and engines reach its managed Redis; only its
routers (and its own engines, for the KV hand-off between pools) reach the engines' gRPC;
only its routers reach the engines' HTTP ports, so no client can take a rank's slots behind
the router's back (the router's reservations would not know of them). The kubelet's probes
need no rule: traffic from a pod's own node is always allowed. The engines' metrics ports
(read-only) stay open to scrapers and the operator, and the router stays open to clients.
PodDisruptionBudgets: a drain or node upgrade evicts one pod of a component at a time, each
leaving through its SIGTERM drain; see `disruption_rule` for the single-pod cases.
"""

from __future__ import annotations

from .names import COMPONENT_LABEL, FLEET_LABEL, MAX_NAME, FleetRef
from .render_storage import REDIS_PORT
from .spec import FleetSpec

PDB_API_VERSION = "policy/v1"  # the operator uses policy/v1beta1 on servers before 1.21


def _components(fleet: FleetRef, components: list[str]) -> dict:
    return {
        "matchLabels": {FLEET_LABEL: fleet.name[:MAX_NAME]},
        "matchExpressions": [
            {"key": COMPONENT_LABEL, "operator": "In", "values": sorted(components)}
        ],
    }


def _engines(spec: FleetSpec) -> list[str]:
    return [f"engine-{name}" for name in spec.enabled_pools()]


def _policy(fleet: FleetRef, suffix: str, pods: dict, ingress: list[dict]) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": fleet.metadata(suffix, "network-policy"),
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def render_network_policies(
    fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]
) -> list[dict]:
    """Ingress rules for the Redis and engine pods of the fleet."""
    engines = _engines(spec)
    fleet_pods = [{"podSelector": _components(fleet, ["router", *engines])}]
    policies = []
    if spec.redis.mode == "managed":
        redis_port = [{"protocol": "TCP", "port": REDIS_PORT}]
        redis_pods = {"matchLabels": fleet.selector("redis")}
        rule = {"from": fleet_pods, "ports": redis_port}
        policies.append(_policy(fleet, "redis", redis_pods, [rule]))
    most = max(spec.pool(name).ranks_per_pod for name in spec.enabled_pools())

    def tcp(base: int) -> list[dict]:
        return [{"protocol": "TCP", "port": base + index} for index in range(most)]

    routers = [{"podSelector": _components(fleet, ["router"])}]
    rules = [
        {"from": fleet_pods, "ports": tcp(spec.ports.engine_grpc)},
        {"from": routers, "ports": tcp(spec.ports.engine_http)},
        {"ports": tcp(spec.ports.engine_metrics)},
    ]
    policies.append(_policy(fleet, "engines", _components(fleet, engines), rules))
    return policies


def disruption_rule(replicas: int, costly_restart: bool) -> dict[str, int]:
    """How many pods of a component an eviction may take: one at a time, except the only pod
    of a component whose restart is costly, which may not be evicted at all.

    `maxUnavailable: 1` over a single pod allows evicting it, so it protects nothing. An
    engine pool's only rank is protected (`minAvailable: 1`): evicting it stops the pool (the
    generation pool: the fleet) for a model load and loses its retained KV; a node drain waits
    until the pool is scaled to two, or the budget is overridden. A single router or the
    managed Redis may be evicted: a router restarts in seconds after draining its streams, and
    the routers ride out a Redis restart on their local mirrors and write the pins back
    (services/router/failover_store.py), so neither is worth holding up node maintenance.
    """
    if replicas <= 1 and costly_restart:
        return {"minAvailable": 1}
    return {"maxUnavailable": 1}


def _budget(fleet: FleetRef, suffix: str, component: str, rule: dict[str, int]) -> dict:
    return {
        "apiVersion": PDB_API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": fleet.metadata(suffix, component),
        "spec": {**rule, "selector": {"matchLabels": fleet.selector(component)}},
    }


def render_disruption_budgets(
    fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]
) -> list[dict]:
    """One budget per pool, one for the routers, one for the managed Redis."""
    router_rule = disruption_rule(spec.routing.replicas, costly_restart=False)
    budgets = [_budget(fleet, "router", "router", router_rule)]
    if spec.redis.mode == "managed":
        budgets.append(_budget(fleet, "redis", "redis", disruption_rule(1, costly_restart=False)))
    budgets += [
        _budget(fleet, name, f"engine-{name}", disruption_rule(replicas[name], costly_restart=True))
        for name in spec.enabled_pools()
    ]
    return budgets
