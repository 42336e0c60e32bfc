"""The engine ConfigMap: one `<pool>.yaml` per pool, each mounted as /etc/kvfleet/engine.yaml."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from .names import FleetRef
from .spec import FleetSpec

DISK_TIER_DIR = "/var/lib/kvfleet/disk"
MODEL_MOUNT = "/models"


def served_model_path(spec: FleetSpec) -> str:
    """Where engines (and the router, for the tokenizer) find the model's directory."""
    if spec.model.pvc_name:
        return f"{MODEL_MOUNT}/{spec.model.path.lstrip('/')}"
    return spec.model.path


def model_volume(spec: FleetSpec) -> tuple[list[dict], list[dict]]:
    """The weights' PVC, read-only at MODEL_MOUNT (none when the model path is in the image)."""
    if not spec.model.pvc_name:
        return [], []
    claim = {"claimName": spec.model.pvc_name, "readOnly": True}
    volume = {"name": "model", "persistentVolumeClaim": claim}
    return [volume], [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}]


def engine_config(spec: FleetSpec, pool_name: str) -> dict[str, Any]:
    """What an engine rank of `pool_name` reads from --config (snake_case keys)."""
    pool = spec.pool(pool_name)
    model_path = served_model_path(spec)
    tiers = spec.kv_tiers
    return {
        "model": {
            "name": spec.model.name,
            "path": model_path,
            "config": spec.model.config.model_dump(exclude_none=True),
        },
        "max_batch_size": pool.max_batch_size,
        "ranks_per_pod": pool.ranks_per_pod,
        # Only when > 1: a TP-1 engine.yaml stays as it was.
        **({"tensor_parallel": pool.tensor_parallel} if pool.tensor_parallel > 1 else {}),
        "reuse": {
            "policy": spec.reuse.policy,
            "max_num_turns": spec.reuse.max_num_turns,
            "checkpoint": spec.reuse.checkpoint,
            "keep_root": spec.reuse.keep_root,
            "keep_branch_points": spec.reuse.branch_points,
        },
        "kv_tiers": {
            "gpu_memory_fraction": tiers.gpu_memory_fraction,
            "host_gib": tiers.host_gib,
            "disk": {"enabled": tiers.disk.enabled, "dir": DISK_TIER_DIR},
        },
    }


def config_key(pool_name: str) -> str:
    """The ConfigMap key holding `pool_name`'s engine.yaml."""
    return f"{pool_name}.yaml"


def config_hash(spec: FleetSpec, pool_name: str) -> str:
    """A digest of a pool's engine config: in the pod template, so a change rolls the pods."""
    text = json.dumps(engine_config(spec, pool_name), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def render_engine_configmap(
    fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int]
) -> list[dict]:
    """The ConfigMap `<fleet>-engine` with one engine.yaml per enabled pool."""
    data = {
        config_key(name): yaml.safe_dump(engine_config(spec, name), sort_keys=True)
        for name in spec.enabled_pools()
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": fleet.metadata("engine", "engine-config"),
            "data": data,
        }
    ]
