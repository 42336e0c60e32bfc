"""What one engine rank runs with: model, slots, step budget, reuse policy, KV pool size.

`load_engine_config` reads the operator's `engine.yaml` (snake_case keys, unknown ones kept out):

    model: {name: tiny, path: "", config: {}}
    max_batch_size: 8
    reuse: {policy: per_conversation, max_num_turns: 5, checkpoint: true,
            keep_root: false, keep_branch_points: 0}
    kv_tiers: {gpu_memory_fraction: 0.9, host_gib: 0, host_pages: null,
               disk: {enabled: false, dir: ..., gib: 32, pages: null, prefetch_num_reqs: 4}}
    engine: {page_size: 16, max_num_batched_tokens: 256, kv_pages: null, seed: 0, ...}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROLES = ("both", "context", "generation")


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine rank needs besides its network addresses."""

    model: str = "tiny"
    model_path: str = ""
    seed: int = 0
    device: str = "cpu"
    attention_backend: str = "auto"
    compute_backend: str = "torch"
    # The `sim` compute backend (compute_sim.py): hardware figures of this sim_costs.yaml
    # ("": the packaged one), and a factor on every step's sleep (0: no sleeping).
    sim_costs_path: str = ""
    sim_time_scale: float = 1.0
    role: str = "both"
    max_batch_size: int = 8
    max_num_batched_tokens: int = 256
    page_size: int = 16
    kv_pages: int | None = None  # per life cycle pool; None: sized by kvstore's plan_pools
    # Pages of named pools ((life cycle, pages) pairs, or a mapping in engine.yaml); they
    # override kv_pages / plan_pools for those pools (a simulator arm's exact split).
    kv_pool_pages: tuple[tuple[str, int], ...] = ()
    reuse_policy: str = "per_conversation"
    max_num_turns: int = 5
    keep_root: bool = False  # per_conversation: also keep the first turn's endpoints
    keep_branch_points: int = 0  # per_conversation: branch endpoints a conversation keeps
    checkpoint: bool = True
    checkpoint_margin_tokens: int = 512
    window_replay_tokens: int = 0
    disk_tier_dir: str = ""
    # KV tiers under the device pools (kvfleet.kvstore.tiers); pages per life cycle come from
    # the GiB split like the device pools, unless *_pages fixes them.
    host_kv_gib: float = 0.0  # this rank's host tier; 0: none
    host_kv_pages: int | None = None
    disk_tier_enabled: bool = True  # the shared disk tier in disk_tier_dir (when set)
    disk_kv_gib: float = 32.0  # this rank's share of the shared disk volume
    disk_kv_pages: int | None = None
    disk_prefetch_num_reqs: int = 4
    torch_threads: int = 1
    # Disaggregation (kvfleet.services.disagg): how long a context rank keeps a parked
    # request's KV, how long a receiver waits for it, and the transports it tries in order.
    handoff_hold_seconds: float = 30.0
    handoff_timeout_seconds: float = 10.0
    handoff_transports: tuple[str, ...] = ("grpc", "disk")
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_num_batched_tokens", "page_size", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.kv_pages is not None and self.kv_pages < 2:
            raise ValueError(
                f"kv_pages must be >= 2 (page 0 is the null page), got {self.kv_pages}"
            )
        pools = tuple(sorted(dict(self.kv_pool_pages).items()))
        object.__setattr__(self, "kv_pool_pages", pools)
        small = {name: pages for name, pages in pools if pages < 2}
        if small:
            raise ValueError(f"kv_pool_pages must be >= 2 per pool (null page), got {small}")
        for name in ("host_kv_gib", "host_kv_pages", "disk_kv_gib", "disk_kv_pages"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.disk_prefetch_num_reqs < 0:
            raise ValueError(
                f"disk_prefetch_num_reqs must be >= 0, got {self.disk_prefetch_num_reqs}"
            )
        if self.sim_time_scale < 0:
            raise ValueError(f"sim_time_scale must be >= 0, got {self.sim_time_scale}")
        if self.max_num_turns < 1:
            raise ValueError(f"max_num_turns must be >= 1, got {self.max_num_turns}")
        if self.keep_branch_points < 0:
            raise ValueError(f"keep_branch_points must be >= 0, got {self.keep_branch_points}")

    def with_changes(self, **changes: Any) -> EngineConfig:
        """A copy with some fields replaced; None values are ignored (unset CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def engine_config_from_dict(data: dict[str, Any]) -> EngineConfig:
    """Map the operator's engine.yaml layout onto EngineConfig."""
    model = data.get("model") or {}
    reuse = data.get("reuse") or {}
    tiers = data.get("kv_tiers") or {}
    values: dict[str, Any] = dict(data.get("engine") or {})
    if isinstance(model, str):
        values["model"] = model
    else:
        if model.get("name"):
            values["model"] = model["name"]
        if model.get("path"):
            values["model_path"] = model["path"]
    if "max_batch_size" in data:
        values["max_batch_size"] = int(data["max_batch_size"])
    if "policy" in reuse:
        values["reuse_policy"] = reuse["policy"]
    if "max_num_turns" in reuse:
        values["max_num_turns"] = int(reuse["max_num_turns"])
    if "checkpoint" in reuse:
        values["checkpoint"] = bool(reuse["checkpoint"])
    if "keep_root" in reuse:
        values["keep_root"] = bool(reuse["keep_root"])
    if "keep_branch_points" in reuse:
        values["keep_branch_points"] = int(reuse["keep_branch_points"])
    values.update(_tier_values(tiers))
    known = {f.name for f in dataclasses.fields(EngineConfig)} - {"extra"}
    unknown = {k: v for k, v in values.items() if k not in known}
    return EngineConfig(**{k: v for k, v in values.items() if k in known}, extra=unknown)


# engine.yaml `kv_tiers` keys -> EngineConfig fields (`disk.*` inside the disk block).
TIER_KEYS = {"host_gib": "host_kv_gib", "host_pages": "host_kv_pages"}
DISK_KEYS = {
    "enabled": "disk_tier_enabled",
    "dir": "disk_tier_dir",
    "gib": "disk_kv_gib",
    "pages": "disk_kv_pages",
    "prefetch_num_reqs": "disk_prefetch_num_reqs",
}


def _tier_values(tiers: dict[str, Any]) -> dict[str, Any]:
    """`kv_tiers: {host_gib, host_pages, disk: {enabled, dir, gib, pages, prefetch_num_reqs}}`."""
    disk = tiers.get("disk") or {}
    values = {field: tiers[key] for key, field in TIER_KEYS.items() if tiers.get(key) is not None}
    values.update(
        {field: disk[key] for key, field in DISK_KEYS.items() if disk.get(key) is not None}
    )
    if not disk.get("enabled", True):
        # NOTE: the dir stays unset too: the hand-off's disk transport keys on it alone.
        values.pop("disk_tier_dir", None)
        values["disk_tier_enabled"] = False
    return values


def load_engine_config(path: str | Path) -> EngineConfig:
    """Read an engine.yaml; a missing file is an error that names the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"engine config {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"engine config {path} must be a mapping, got {type(data).__name__}")
    return engine_config_from_dict(data)
