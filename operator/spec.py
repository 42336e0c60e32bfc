"""The KVFleet custom resource's spec as typed models, and the checks a schema cannot express.

The CRD (charts/kvfleet/crds/) validates shapes and applies defaults on a real API server; these
models repeat the same defaults (a test keeps the two equal) so the operator sees one complete
spec either way, and add the cross-field rules that become an `InvalidSpec` condition.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .spec_checks import name_problems, port_problems, resource_problems, size_problems

POOL_NAMES: tuple[str, ...] = ("context", "generation")
# Bounds the CRD also sets (a test keeps them equal): a typo of 10000 replicas should be
# refused, not scheduled. Routers are few: each holds every pin in memory.
MAX_POOL_REPLICAS = 1000
MAX_ROUTERS = 16
MAX_GPUS_PER_POD = 16


class SpecError(ValueError):
    """A fleet spec that the operator cannot run; the message names the fields at fault."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _default_image(component: str) -> str:
    """The operator's default image of a fleet's router or engine: the chart sets it (values
    fleetImages, following the chart's image tag), so an upgrade to a new tag rolls every fleet
    that names no image of its own; the CRD defaults neither."""
    fallback = f"ghcr.io/kvfleet/{component}:0.1.0"
    return os.environ.get(f"KVFLEET_{component.upper()}_IMAGE") or fallback


class Images(_Model):
    engine: str = Field(default_factory=lambda: _default_image("engine"))
    router: str = Field(default_factory=lambda: _default_image("router"))
    redis: str = "redis:7.4-alpine"
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class ModelSettings(_Model):
    """Settings of the served model on top of its checkpoint (engine.yaml's model.config)."""

    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    max_model_len: int | None = Field(default=None, ge=1)


class Model(_Model):
    name: str
    path: str
    pvc_name: str | None = None
    config: ModelSettings = Field(default_factory=ModelSettings)


class Pool(_Model):
    enabled: bool = True
    replicas: int = Field(default=1, ge=0, le=MAX_POOL_REPLICAS)
    gpus_per_pod: int = Field(default=1, ge=0, le=MAX_GPUS_PER_POD)
    ranks_per_pod: int = Field(default=1, ge=1, le=MAX_GPUS_PER_POD)
    # GPUs of one rank (tensor parallelism): the pod runs one rank of this many workers.
    tensor_parallel: int = Field(default=1, ge=1, le=MAX_GPUS_PER_POD)
    max_batch_size: int = Field(default=32, ge=1)
    resources: dict[str, Any] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class Pools(_Model):
    context: Pool = Field(default_factory=Pool)
    generation: Pool = Field(default_factory=Pool)


class DiskTier(_Model):
    enabled: bool = True
    storage_class_name: str | None = None
    size: str = "500Gi"
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = "ReadWriteMany"


class KVTiers(_Model):
    gpu_memory_fraction: float = Field(default=0.9, gt=0.0, le=0.99)
    # The pages' dtype, the engine's --kv-cache-dtype: fp8_e4m3 keeps twice the pages.
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3"] = "auto"
    host_gib: int = Field(default=64, ge=0, alias="hostGiB")
    disk: DiskTier = Field(default_factory=DiskTier)


class Routing(_Model):
    replicas: int = Field(default=1, ge=1, le=MAX_ROUTERS)
    affinity: Literal["strict", "lenient"] = "strict"
    max_wait_passes: int = Field(default=1_000_000, ge=0)  # the time bound binds
    max_wait_seconds: float = Field(default=30.0, ge=0.0)
    placement: Literal["load", "prefix"] = "prefix"
    pin_ttl_seconds: int = Field(default=3600, ge=1)
    heartbeat_timeout_seconds: int = Field(default=10, ge=1)


# Two: a context reset resumes where the tools or the system prompt end (docs/simulator.md).
DEFAULT_BRANCH_POINTS = 2


class Reuse(_Model):
    policy: Literal["per_conversation", "per_request", "all_reusable"] = "per_conversation"
    max_num_turns: int = Field(default=5, ge=1)
    checkpoint: bool = True
    # per_conversation only (docs/kvstore.md): also keep the first turn's endpoints, and up to
    # this many branch-point windows per conversation (unset: DEFAULT_BRANCH_POINTS).
    keep_root: bool = False
    keep_branch_points: int | None = Field(default=None, ge=0)

    @property
    def branch_points(self) -> int:
        """The branch records the engine keeps: keepBranchPoints, else the default under
        per_conversation (the only policy that keeps any), else none."""
        if self.keep_branch_points is not None:
            return self.keep_branch_points
        return DEFAULT_BRANCH_POINTS if self.policy == "per_conversation" else 0


class SecretKeyRef(_Model):
    name: str
    key: str


class Redis(_Model):
    mode: Literal["managed", "external"] = "managed"
    url: str | None = None
    url_secret_ref: SecretKeyRef | None = None
    # managed only: the memory Redis may use (it evicts the least recently used pins beyond).
    max_memory_mib: int = Field(default=768, ge=16, alias="maxMemoryMiB")


class PoolBounds(_Model):
    min_replicas: int = Field(default=1, ge=0, le=MAX_POOL_REPLICAS)
    max_replicas: int = Field(default=4, ge=0, le=MAX_POOL_REPLICAS)


class ScaleTargets(_Model):
    queue_depth_per_rank: float = Field(default=4.0, gt=0.0)
    deferrals_per_second: float = Field(default=0.5, gt=0.0)
    ttft_p90_seconds: float = Field(default=2.0, gt=0.0)
    kv_usage: float = Field(default=0.9, gt=0.0, le=1.0)
    retained_working_set: float = Field(default=0.8, gt=0.0, le=1.0)


class Autoscaling(_Model):
    enabled: bool = False
    interval_seconds: float = Field(default=30.0, gt=0.0)
    window_seconds: float = Field(default=120.0, gt=0.0)
    scale_in_below: float = Field(default=0.5, gt=0.0, lt=1.0)
    scale_out_cooldown_seconds: float = Field(default=180.0, ge=0.0)
    scale_in_cooldown_seconds: float = Field(default=600.0, ge=0.0)
    max_step: int = Field(default=2, ge=1)
    context: PoolBounds = Field(default_factory=PoolBounds)
    generation: PoolBounds = Field(default_factory=PoolBounds)
    targets: ScaleTargets = Field(default_factory=ScaleTargets)


class Ports(_Model):
    router_grpc: int = Field(default=50051, ge=1, le=65535)
    router_rank: int = Field(default=50052, ge=1, le=65535)
    router_http: int = Field(default=8000, ge=1, le=65535)
    router_metrics: int = Field(default=9400, ge=1, le=65535)
    engine_grpc: int = Field(default=50061, ge=1, le=65535)
    engine_http: int = Field(default=8000, ge=1, le=65535)
    engine_metrics: int = Field(default=9401, ge=1, le=65535)


# Cross-field problems travel in one ValueError through pydantic; parse_spec splits them.
PROBLEM_SEPARATOR = "\n"


class FleetSpec(_Model):
    """The whole spec of one fleet, defaults filled in."""

    model: Model
    images: Images = Field(default_factory=Images)
    pools: Pools = Field(default_factory=Pools)
    kv_tiers: KVTiers = Field(default_factory=KVTiers)
    routing: Routing = Field(default_factory=Routing)
    reuse: Reuse = Field(default_factory=Reuse)
    redis: Redis = Field(default_factory=Redis)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    ports: Ports = Field(default_factory=Ports)
    drain_seconds: int = Field(default=120, ge=0)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> FleetSpec:
        problems = [
            *_redis_problems(self.redis),
            *_reuse_problems(self.reuse),
            *_pool_problems(self),
            *_quantity_problems(self),
            *_ports_problems(self),
        ]
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    def pool(self, name: str) -> Pool:
        """The pool called `name` (one of POOL_NAMES)."""
        return getattr(self.pools, name)

    def bounds(self, name: str) -> PoolBounds:
        """The autoscaling bounds of the pool called `name`."""
        return getattr(self.autoscaling, name)

    def enabled_pools(self) -> tuple[str, ...]:
        """Names of the pools that run, in POOL_NAMES order."""
        return tuple(name for name in POOL_NAMES if self.pool(name).enabled)


def _quantity_problems(spec: FleetSpec) -> list[str]:
    problems = []
    for name in POOL_NAMES:
        where = f"spec.pools.{name}.resources"
        problems += resource_problems(where, spec.pool(name).resources)
    return problems + size_problems("spec.kvTiers.disk.size", spec.kv_tiers.disk.size)


def _ports_problems(spec: FleetSpec) -> list[str]:
    ports = spec.ports
    router = {
        "routerGrpc": ports.router_grpc,
        "routerRank": ports.router_rank,
        "routerHttp": ports.router_http,
        "routerMetrics": ports.router_metrics,
    }
    engine = {
        "engineGrpc": ports.engine_grpc,
        "engineHttp": ports.engine_http,
        "engineMetrics": ports.engine_metrics,
    }
    ranks = max(spec.pool(name).ranks_per_pod for name in spec.enabled_pools() or POOL_NAMES)
    return port_problems(router, engine, ranks)


def _redis_problems(redis: Redis) -> list[str]:
    given = [
        name
        for name, value in (("url", redis.url), ("urlSecretRef", redis.url_secret_ref))
        if value
    ]
    if redis.mode == "external" and len(given) != 1:
        return [f"redis.mode=external needs exactly one of url, urlSecretRef (got {len(given)})"]
    if redis.mode == "managed" and given:
        return [f"redis.mode=managed takes no {', '.join(given)}"]
    return []


def _reuse_problems(reuse: Reuse) -> list[str]:
    # Only per_conversation retains turns; elsewhere the engine would ignore these silently.
    if reuse.policy == "per_conversation":
        return []
    given = [
        f"{name}={str(value).lower()}"
        for name, value in (
            ("keepRoot", reuse.keep_root),
            ("keepBranchPoints", reuse.keep_branch_points),
        )
        if value
    ]
    if given:
        joined = ", ".join(given)
        return [f"reuse.{joined}: only policy per_conversation keeps turns (got {reuse.policy})"]
    return []


def _pool_problems(spec: FleetSpec) -> list[str]:
    problems = []
    if not spec.pools.generation.enabled:
        problems.append("pools.generation.enabled=false: the generation pool is required")
    for name in spec.enabled_pools():
        pool, bounds = spec.pool(name), spec.bounds(name)
        if bounds.min_replicas > bounds.max_replicas:
            problems.append(
                f"autoscaling.{name}: minReplicas={bounds.min_replicas}"
                f" > maxReplicas={bounds.max_replicas}"
            )
        if pool.gpus_per_pod and pool.ranks_per_pod > pool.gpus_per_pod:
            problems.append(
                f"pools.{name}: ranksPerPod={pool.ranks_per_pod} > gpusPerPod={pool.gpus_per_pod}"
            )
        problems += _tensor_parallel_problems(spec, name, pool)
    total_pods = sum(spec.pool(name).replicas for name in spec.enabled_pools())
    disk = spec.kv_tiers.disk
    if disk.enabled and disk.access_mode != "ReadWriteMany" and total_pods > 1:
        problems.append(
            f"kvTiers.disk.accessMode={disk.access_mode} cannot be shared by"
            f" {total_pods} engine pods; use ReadWriteMany"
        )
    return problems


def _tensor_parallel_problems(spec: FleetSpec, name: str, pool: Pool) -> list[str]:
    tp = pool.tensor_parallel
    if tp == 1:
        return []
    problems = []
    if pool.ranks_per_pod != 1:
        problems.append(f"pools.{name}: tensorParallel={tp} runs one rank per pod (ranksPerPod 1)")
    if not spec.model.path:
        problems.append(f"pools.{name}: tensorParallel={tp} needs model.path (a checkpoint)")
    if spec.pools.context.enabled:
        problems.append(
            f"pools.{name}: tensorParallel={tp} needs pools.context.enabled=false "
            "(KV hand-off does not move shards yet)"
        )
    if spec.kv_tiers.disk.enabled:
        problems.append(
            f"pools.{name}: tensorParallel={tp} needs kvTiers.disk.enabled=false "
            "(the disk tier does not hold KV shards yet)"
        )
    return problems


def parse_spec(raw: dict[str, Any]) -> FleetSpec:
    """Parse a fleet's spec; raise SpecError with one line per problem, each naming the field
    at fault from `spec.` down (`spec.pools.context.replicas: ...`)."""
    try:
        return FleetSpec.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            message = error["msg"].removeprefix("Value error, ")
            if error["loc"]:
                where = ".".join(str(part) for part in error["loc"])
                lines.append(f"spec.{where}: {message}")
            else:  # cross-field problems, which name their fields themselves
                lines += [_from_spec(line) for line in message.split(PROBLEM_SEPARATOR)]
        raise SpecError("; ".join(lines)) from None


def _from_spec(problem: str) -> str:
    return problem if problem.startswith("spec.") else f"spec.{problem}"


def parse_fleet(name: str, raw: dict[str, Any]) -> FleetSpec:
    """Parse a fleet's spec and check its name (which the CRD schema cannot limit); raise
    SpecError naming every problem of both."""
    problems = name_problems(name)
    try:
        spec = parse_spec(raw)
    except SpecError as exc:
        problems.append(str(exc))
        spec = None
    if problems or spec is None:
        raise SpecError("; ".join(problems))
    return spec
