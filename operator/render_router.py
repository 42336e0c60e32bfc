"""The router Deployment and its Service."""

from __future__ import annotations

from .names import FleetRef
from .render_config import model_volume, served_model_path
from .render_secret import REDIS_PASSWORD_ENV, REDIS_PASSWORD_KEY, fleet_env, secret_env
from .security import container_security_context, pod_security_context, scratch_volumes
from .spec import FleetSpec

REDIS_URL_ENV = "KVFLEET_REDIS_URL"  # the router's $KVFLEET_REDIS_URL (redis_connect.py)

# Grace beyond the drain time for the process to exit after the drain completes.
EXIT_MARGIN_SECONDS = 15


def router_args(fleet: FleetRef, spec: FleetSpec) -> list[str]:
    """The `kvfleet router` command line, as the router's CLI contract defines it."""
    routing, ports = spec.routing, spec.ports
    # NOTE: no secret on the command line, where every process of the node can read it: the
    # managed Redis's password and an external Redis's URL (which may hold one) reach the
    # router as environment variables ($KVFLEET_REDIS_PASSWORD, $KVFLEET_REDIS_URL).
    managed = ["--redis-url", fleet.redis_url()] if spec.redis.mode == "managed" else []
    return [
        "kvfleet", "router",
        "--grpc-port", str(ports.router_grpc),
        "--rank-port", str(ports.router_rank),
        "--http-port", str(ports.router_http),
        "--metrics-port", str(ports.router_metrics),
        "--replica-id", "$(POD_NAME)",  # $(VAR): expanded by the kubelet from the env
        *managed,
        "--affinity", routing.affinity,
        "--max-wait-passes", str(routing.max_wait_passes),
        "--max-wait-seconds", str(routing.max_wait_seconds),
        "--placement", routing.placement,
        "--pin-ttl-seconds", str(routing.pin_ttl_seconds),
        "--heartbeat-timeout-seconds", str(routing.heartbeat_timeout_seconds),
        # The OpenAI front serves the model's name and renders prompts with its tokenizer.
        "--model", spec.model.name,
        *(["--model-path", model_path] if (model_path := served_model_path(spec)) else []),
    ]  # fmt: skip


def _router_env(fleet: FleetRef, spec: FleetSpec) -> list[dict]:
    env = fleet_env(fleet)
    ref = spec.redis.url_secret_ref
    if spec.redis.mode == "managed":
        env.append(secret_env(fleet, REDIS_PASSWORD_ENV, REDIS_PASSWORD_KEY))
    elif ref is not None:
        env.append(
            {
                "name": REDIS_URL_ENV,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    else:
        env.append({"name": REDIS_URL_ENV, "value": spec.redis.url})
    return env


def render_router(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """Router Deployment `<fleet>-router` and the ClusterIP Service in front of it."""
    ports = spec.ports
    volumes, mounts = scratch_volumes()
    model_volumes, model_mounts = model_volume(spec)
    volumes, mounts = volumes + model_volumes, mounts + model_mounts
    health = {"httpGet": {"path": "/health", "port": "http"}}
    container = {
        "name": "router",
        "image": spec.images.router,
        "imagePullPolicy": spec.images.pull_policy,
        "args": router_args(fleet, spec),
        "env": _router_env(fleet, spec),
        "ports": [
            {"name": "grpc", "containerPort": ports.router_grpc},
            {"name": "rank", "containerPort": ports.router_rank},
            {"name": "http", "containerPort": ports.router_http},
            {"name": "metrics", "containerPort": ports.router_metrics},
        ],
        # HTTP probes work on every Kubernetes version (gRPC probes need 1.24+).
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
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
                {"name": "rank", "port": ports.router_rank, "targetPort": "rank"},
                {"name": "http", "port": ports.router_http, "targetPort": "http"},
                {"name": "metrics", "port": ports.router_metrics, "targetPort": "metrics"},
            ],
        },
    }
    return [deployment, service]
