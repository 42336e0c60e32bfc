"""Stateful dependencies of a fleet: the shared disk-tier PVC and the managed Redis."""

from __future__ import annotations

from .names import FleetRef
from .render_secret import REDIS_PASSWORD_ENV, REDIS_PASSWORD_KEY, secret_env
from .security import container_security_context, pod_security_context, scratch_volumes
from .spec import FleetSpec

REDIS_PORT = 6379
# Redis's own memory beyond `maxmemory` (buffers, fragmentation), in the pod's request and limit.
REDIS_OVERHEAD_MIB = 256


def render_disk_tier(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """The PVC every engine pod mounts as the shared disk tier (none when the tier is off)."""
    disk = spec.kv_tiers.disk
    if not disk.enabled:
        return []
    claim_spec: dict = {
        "accessModes": [disk.access_mode],
        "resources": {"requests": {"storage": disk.size}},
    }
    if disk.storage_class_name:
        claim_spec["storageClassName"] = disk.storage_class_name
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": fleet.metadata("disk", "disk-tier"),
            "spec": claim_spec,
        }
    ]


def render_managed_redis(fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]) -> list[dict]:
    """A single in-memory Redis for pins and slot reservations, when the spec asks for one."""
    redis = spec.redis
    if redis.mode != "managed":
        return []
    volumes, mounts = scratch_volumes()
    memory_mib = redis.max_memory_mib + REDIS_OVERHEAD_MIB
    container = {
        "name": "redis",
        "image": spec.images.redis,
        "imagePullPolicy": spec.images.pull_policy,
        # Pins are soft state that the router rebuilds: no persistence, bounded memory, and a
        # password (the fleet Secret's, expanded by the kubelet) so only the fleet gets in.
        "args": [
            "redis-server",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            f"{redis.max_memory_mib}mb",
            "--maxmemory-policy",
            "allkeys-lru",
            "--requirepass",
            f"$({REDIS_PASSWORD_ENV})",
        ],
        "env": [secret_env(fleet, REDIS_PASSWORD_ENV, REDIS_PASSWORD_KEY)],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "readinessProbe": {"tcpSocket": {"port": REDIS_PORT}, "periodSeconds": 5},
        "resources": {
            "requests": {"cpu": "250m", "memory": f"{memory_mib}Mi"},
            "limits": {"memory": f"{memory_mib}Mi"},
        },
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": fleet.metadata("redis", "redis"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": fleet.selector("redis")},
            "template": {
                "metadata": {"labels": fleet.labels("redis")},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": fleet.metadata("redis", "redis"),
        "spec": {
            "selector": fleet.selector("redis"),
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis"}],
        },
    }
    return [deployment, service]
