"""The router Deployment and its Service."""

from __future__ import annotations

from .names import FleetRef
from .security import container_security_context, pod_security_context, scratch_volumes
from .spec import FleetSpec

# Grace beyond the drain time for the process to exit after the drain completes.
EXIT_MARGIN_SECONDS = 15


def router_args(fleet: FleetRef, spec: FleetSpec) -> list[str]:
    """The `kvfleet router` command line, as the router's CLI contract defines it."""
    routing, ports = spec.routing, spec.ports
    redis_url = fleet.redis_url() if spec.redis.mode == "managed" else spec.redis.url
    if spec.redis.url_secret_ref is not None:
        redis_url = "$(KVFLEET_REDIS_URL)"  # expanded by the kubelet from the Secret env
    return [
        "kvfleet", "router",
        "--grpc-port", str(ports.router_grpc),
        "--metrics-port", str(ports.router_metrics),
        "--redis-url", str(redis_url),
        "--affinity", routing.affinity,
        "--max-wait-passes", str(routing.max_wait_passes),
        "--max-wait-seconds", str(routing.max_wait_seconds),
        "--placement", routing.placement,
        "--pin-ttl-seconds", str(routing.pin_ttl_seconds),
        "--heartbeat-timeout-seconds", str(routing.heartbeat_timeout_seconds),
    ]  # fmt: skip


def _router_env(spec: FleetSpec) -> list[dict]:
    ref = spec.redis.url_secret_ref
    if ref is None:
        return []
    return [
        {
            "name": "KVFLEET_REDIS_URL",
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    ]


def render_router(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """Router Deployment `<fleet>-router` and the ClusterIP Service in front of it."""
    ports = spec.ports
    volumes, mounts = scratch_volumes()
    container = {
        "name": "router",
        "image": spec.images.router,
        "imagePullPolicy": spec.images.pull_policy,
        "args": router_args(fleet, spec),
        "env": _router_env(spec),
        "ports": [
            {"name": "grpc", "containerPort": ports.router_grpc},
            {"name": "metrics", "containerPort": ports.router_metrics},
        ],
        "readinessProbe": {"grpc": {"port": ports.router_grpc}, "periodSeconds": 5},
        "livenessProbe": {"grpc": {"port": ports.router_grpc}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": fleet.metadata("router", "router"),
        "spec": {
            "replicas": spec.routing.replicas,
            "selector": {"matchLabels": fleet.selector("router")},
            "template": {
                "metadata": {"labels": fleet.labels("router")},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": spec.drain_seconds + EXIT_MARGIN_SECONDS,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": fleet.metadata("router", "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": fleet.selector("router"),
            "ports": [
                {"name": "grpc", "port": ports.router_grpc, "targetPort": "grpc"},
                {"name": "metrics", "port": ports.router_metrics, "targetPort": "metrics"},
            ],
        },
    }
    return [deployment, service]
