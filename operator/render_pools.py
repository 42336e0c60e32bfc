"""The engine pools: a StatefulSet per pool (stable rank identities) and a headless Service."""

from __future__ import annotations

from kubernetes.utils.quantity import parse_quantity

from .names import CONFIG_HASH_ANNOTATION, FleetRef
from .render_config import DISK_TIER_DIR, config_hash, config_key, model_volume
from .render_router import EXIT_MARGIN_SECONDS
from .render_secret import fleet_env
from .security import container_security_context, pod_security_context, scratch_volumes
from .spec import FleetSpec

GIB = 2**30
# Memory an engine process needs besides its host KV tier (weights staging, tokenizer, Python).
ENGINE_PROCESS_GIB = 8
# Where the engine reads its own pod annotations (the drain mark) through the downward API.
PODINFO_DIR = "/etc/podinfo"


def engine_role(spec: FleetSpec, pool_name: str) -> str:
    """`context`/`generation` when both pools run; `both` for a generation pool on its own."""
    if pool_name == "generation" and not spec.pools.context.enabled:
        return "both"
    return pool_name


def engine_args(fleet: FleetRef, spec: FleetSpec, pool_name: str) -> list[str]:
    """The `kvfleet engine` command line, as the engine's CLI contract defines it; a
    tensor-parallel pool starts its workers under torchrun (worker 0 serves, the others
    follow it)."""
    ports = spec.ports
    tp = spec.pool(pool_name).tensor_parallel
    launcher = (
        ["torchrun", "--standalone", f"--nproc-per-node={tp}", "-m", "kvfleet.services.cli"]
        if tp > 1
        else ["kvfleet"]
    )
    return [
        *launcher, "engine",
        "--role", engine_role(spec, pool_name),
        "--grpc-port", str(ports.engine_grpc),
        "--http-port", str(ports.engine_http),
        "--metrics-port", str(ports.engine_metrics),
        "--router", fleet.router_address(ports.router_rank),  # the rank-facing port
        "--rank-id", "$(POD_NAME)",
        "--config", "/etc/kvfleet/engine.yaml",
        "--disk-tier-dir", DISK_TIER_DIR,
        "--drain-seconds", str(spec.drain_seconds),
        "--kv-cache-dtype", spec.kv_tiers.kv_cache_dtype,
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
    model_volumes, model_mounts = model_volume(spec)
    return volumes + model_volumes, mounts + model_mounts


def _resources(spec: FleetSpec, pool_name: str) -> dict:
    """The pool's resources, with memory requests (and limits) raised to hold the host KV
    tier of every rank in the pod plus the process itself: a pod asking for less would be
    scheduled onto a node that cannot hold its tier and then killed for memory."""
    pool = spec.pool(pool_name)
    resources = {key: dict(value) for key, value in pool.resources.items()}
    if pool.gpus_per_pod:  # a tensor-parallel rank needs one GPU per worker
        gpus = max(pool.gpus_per_pod, pool.tensor_parallel * pool.ranks_per_pod)
        resources.setdefault("limits", {})["nvidia.com/gpu"] = gpus
    floor_gib = spec.kv_tiers.host_gib * pool.ranks_per_pod + ENGINE_PROCESS_GIB
    for kind in ("requests", "limits"):
        given = resources.get(kind, {}).get("memory")
        if kind == "limits" and given is None:
            continue  # no limit set: none added
        if given is None or parse_quantity(given) < floor_gib * GIB:
            resources.setdefault(kind, {})["memory"] = f"{floor_gib}Gi"
    return resources


def rank_ports(spec: FleetSpec, pool_name: str) -> list[dict]:
    """Container ports of every rank in the pod: rank i listens on each base port + i."""
    ports = spec.ports
    named = []
    for index in range(spec.pool(pool_name).ranks_per_pod):
        suffix = f"-{index}" if index else ""
        named += [
            {"name": f"grpc{suffix}", "containerPort": ports.engine_grpc + index},
            {"name": f"http{suffix}", "containerPort": ports.engine_http + index},
            {"name": f"metrics{suffix}", "containerPort": ports.engine_metrics + index},
        ]
    return named


def _engine_container(fleet: FleetRef, spec: FleetSpec, pool_name: str, mounts: list[dict]) -> dict:
    # HTTP probes work on every Kubernetes version (gRPC probes need 1.24+); rank 0 stands
    # for the pod, whose ranks start and stop together.
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "name": "engine",
        "image": spec.images.engine,
        "imagePullPolicy": spec.images.pull_policy,
        "args": engine_args(fleet, spec, pool_name),
        "env": fleet_env(fleet),
        "ports": rank_ports(spec, pool_name),
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 90},
        "readinessProbe": {**health, "periodSeconds": 5},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
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
