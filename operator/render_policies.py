"""Who may reach whom, and how many pods a voluntary disruption may take at once.

NetworkPolicies: only the fleet's routers and engines reach its managed Redis; only its
routers (and its own engines, for the KV hand-off between pools) reach the engines' gRPC.
The engines' HTTP and metrics ports and the router stay open to clients and scrapers.
PodDisruptionBudgets: a drain or node upgrade evicts one rank of a pool (and one router) at a
time, each leaving through its SIGTERM drain.
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


def engine_grpc_ports(spec: FleetSpec) -> list[int]:
    """Every rank's gRPC port across the pools (rank i of a pod: base + i)."""
    most = max(spec.pool(name).ranks_per_pod for name in spec.enabled_pools())
    return [spec.ports.engine_grpc + index for index in range(most)]


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
    open_ports = [
        {"protocol": "TCP", "port": base + index}
        for base in (spec.ports.engine_http, spec.ports.engine_metrics)
        for index in range(most)
    ]
    grpc = [{"protocol": "TCP", "port": port} for port in engine_grpc_ports(spec)]
    rules = [{"from": fleet_pods, "ports": grpc}, {"ports": open_ports}]
    policies.append(_policy(fleet, "engines", _components(fleet, engines), rules))
    return policies


def _budget(fleet: FleetRef, suffix: str, component: str) -> dict:
    return {
        "apiVersion": PDB_API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": fleet.metadata(suffix, component),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": fleet.selector(component)}},
    }


def render_disruption_budgets(
    fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]
) -> list[dict]:
    """One budget per pool and one for the routers: at most one pod of each away at once."""
    budgets = [_budget(fleet, "router", "router")]
    budgets += [_budget(fleet, name, f"engine-{name}") for name in spec.enabled_pools()]
    return budgets
