"""The engine pools: a StatefulSet per pool (stable rank identities) and a headless Service."""

from __future__ import annotations

from .names import CONFIG_HASH_ANNOTATION, FleetRef
from .render_config import DISK_TIER_DIR, MODEL_MOUNT, config_hash, config_key
from .render_router import EXIT_MARGIN_SECONDS
from .security import container_security_context, pod_security_context, scratch_volumes
from .spec import FleetSpec

# Where the engine reads its own pod annotations (the drain mark) through the downward API.
PODINFO_DIR = "/etc/podinfo"


def engine_role(spec: FleetSpec, pool_name: str) -> str:
    """`context`/`generation` when both pools run; `both` for a generation pool on its own."""
    if pool_name == "generation" and not spec.pools.context.enabled:
        return "both"
    return pool_name


def engine_args(fleet: FleetRef, spec: FleetSpec, pool_name: str) -> list[str]:
    """The `kvfleet engine` command line, as the engine's CLI contract defines it."""
    ports = spec.ports
    return [
        "kvfleet", "engine",
        "--role", engine_role(spec, pool_name),
        "--grpc-port", str(ports.engine_grpc),
        "--http-port", str(ports.engine_http),
        "--metrics-port", str(ports.engine_metrics),
        "--router", fleet.router_address(ports.router_grpc),
        "--rank-id", "$(POD_NAME)",
        "--config", "/etc/kvfleet/engine.yaml",
        "--disk-tier-dir", DISK_TIER_DIR,
    ]  # fmt: skip


def _volumes(fleet: FleetRef, spec: FleetSpec, pool_name: str) -> tuple[list[dict], list[dict]]:
    volumes, mounts = scratch_volumes()
    volumes.append(
        {
            "name": "config",
            "configMap": {
                "name": fleet.child_name("engine"),
                "items": [{"key": config_key(pool_name), "path": "engine.yaml"}],
            },
        }
    )
    mounts.append({"name": "config", "mountPath": "/etc/kvfleet", "readOnly": True})
    volumes.append(
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                ]
            },
        }
    )
    mounts.append({"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True})
    if spec.kv_tiers.disk.enabled:
        volumes.append(
            {"name": "disk-tier", "persistentVolumeClaim": {"claimName": fleet.child_name("disk")}}
        )
        mounts.append({"name": "disk-tier", "mountPath": DISK_TIER_DIR})
    if spec.model.pvc_name:
        claim = {"claimName": spec.model.pvc_name, "readOnly": True}
        volumes.append({"name": "model", "persistentVolumeClaim": claim})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    return volumes, mounts


def _resources(spec: FleetSpec, pool_name: str) -> dict:
    pool = spec.pool(pool_name)
    resources = {key: dict(value) for key, value in pool.resources.items()}
    if pool.gpus_per_pod:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = pool.gpus_per_pod
    return resources


def _engine_container(fleet: FleetRef, spec: FleetSpec, pool_name: str, mounts: list[dict]) -> dict:
    ports = spec.ports
    return {
        "name": "engine",
        "image": spec.images.engine,
        "imagePullPolicy": spec.images.pull_policy,
        "args": engine_args(fleet, spec, pool_name),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [
            {"name": "grpc", "containerPort": ports.engine_grpc},
            {"name": "http", "containerPort": ports.engine_http},
            {"name": "metrics", "containerPort": ports.engine_metrics},
        ],
        "startupProbe": {
            "grpc": {"port": ports.engine_grpc},
            "periodSeconds": 10,
            "failureThreshold": 90,
        },
        "readinessProbe": {"grpc": {"port": ports.engine_grpc}, "periodSeconds": 5},
        "resources": _resources(spec, pool_name),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }


def render_pool(fleet: FleetRef, spec: FleetSpec, pool_name: str, replicas: int) -> list[dict]:
    """StatefulSet `<fleet>-<pool>` and its headless Service (one DNS name per rank)."""
    pool = spec.pool(pool_name)
    component = f"engine-{pool_name}"
    volumes, mounts = _volumes(fleet, spec, pool_name)
    pod_spec = {
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": spec.drain_seconds + EXIT_MARGIN_SECONDS,
        "containers": [_engine_container(fleet, spec, pool_name, mounts)],
        "volumes": volumes,
        "nodeSelector": dict(pool.node_selector),
        "tolerations": list(pool.tolerations),
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": fleet.metadata(pool_name, component),
        "spec": {
            "replicas": replicas,
            "serviceName": fleet.child_name(pool_name),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": fleet.selector(component)},
            "template": {
                "metadata": {
                    "labels": fleet.labels(component),
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash(spec, pool_name)},
                },
                "spec": pod_spec,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": fleet.metadata(pool_name, component),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": fleet.selector(component),
            "ports": [{"name": "grpc", "port": spec.ports.engine_grpc, "targetPort": "grpc"}],
        },
    }
    return [statefulset, service]


def render_pools(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """Every enabled pool, with the replica count the caller decided for it."""
    children: list[dict] = []
    for name in spec.enabled_pools():
        children.extend(render_pool(fleet, spec, name, replicas[name]))
    return children
