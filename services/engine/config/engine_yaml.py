"""The operator's engine.yaml as typed models: every key is known, an unknown one is an error.

Layout (snake_case; the operator renders it, docs/operator.md documents it):

    model: {name: tiny, path: "", config: {dtype: bfloat16, max_model_len: 32768}}
    max_batch_size: 8
    kv_cache_dtype: auto        # auto (the weights' dtype) | bf16 | fp8_e4m3
    ranks_per_pod: 1
    tensor_parallel: 1          # workers (GPUs) of the rank, started by torchrun
    reuse: {policy: per_conversation, max_num_turns: 5, checkpoint: true,
            keep_root: false, keep_branch_points: 2, discover_branch_points: false}
    kv_tiers: {gpu_memory_fraction: 0.9, host_gib: 0, host_pages: null, host_exclusive: true,
               disk: {enabled: false, dir: ..., gib: 32, pages: null, prefetch_num_reqs: 4,
                      read_threads: 1}}
    engine: {<any EngineConfig field>: value}   # tuning the operator does not render

A misspelt key would otherwise run the engine on a default nobody chose, so it fails the
start with the key's dotted path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from .engine_config import EngineConfig

DTYPES = ("float32", "bfloat16", "float16")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSettings(_Strict):
    """`model.config`: settings of the served model on top of its checkpoint or preset."""

    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    max_model_len: int | None = Field(default=None, ge=1)


class ModelSection(_Strict):
    name: str | None = None
    path: str | None = None
    config: ModelSettings = Field(default_factory=ModelSettings)


class ReuseSection(_Strict):
    policy: str | None = None
    max_num_turns: int | None = None
    checkpoint: bool | None = None
    keep_root: bool | None = None
    keep_branch_points: int | None = None
    discover_branch_points: bool | None = None


class DiskSection(_Strict):
    enabled: bool = True
    dir: str | None = None
    gib: float | None = None
    pages: int | None = None
    prefetch_num_reqs: int | None = None
    read_threads: int | None = None
    write_behind: bool | None = None


class TiersSection(_Strict):
    gpu_memory_fraction: float | None = None
    host_gib: float | None = None
    host_pages: int | None = None
    host_exclusive: bool | None = None
    disk: DiskSection = Field(default_factory=DiskSection)


# `engine:` takes EngineConfig's own field names (values are checked by EngineConfig itself).
_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)} - {"extra"}
EngineSection = create_model(
    "EngineSection",
    __config__=ConfigDict(extra="forbid"),
    **{name: (Any, None) for name in sorted(_ENGINE_FIELDS)},
)


class EngineYaml(_Strict):
    """The whole file."""

    model: ModelSection = Field(default_factory=ModelSection)
    max_batch_size: int | None = None
    kv_cache_dtype: Literal["auto", "bf16", "fp8_e4m3"] | None = None
    ranks_per_pod: int | None = Field(default=None, ge=1)
    tensor_parallel: int | None = Field(default=None, ge=1)
    reuse: ReuseSection = Field(default_factory=ReuseSection)
    kv_tiers: TiersSection = Field(default_factory=TiersSection)
    engine: EngineSection = Field(default_factory=EngineSection)  # type: ignore[valid-type]

    @field_validator("model", mode="before")
    @classmethod
    def _model_by_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value  # `model: tiny`


# Section key -> EngineConfig field, where the two names differ.
REUSE_FIELDS = {"policy": "reuse_policy"}
TIER_FIELDS = {
    "host_gib": "host_kv_gib",
    "host_pages": "host_kv_pages",
    "host_exclusive": "host_kv_exclusive",
}
DISK_FIELDS = {
    "enabled": "disk_tier_enabled",
    "dir": "disk_tier_dir",
    "gib": "disk_kv_gib",
    "pages": "disk_kv_pages",
    "prefetch_num_reqs": "disk_prefetch_num_reqs",
    "read_threads": "disk_read_threads",
    "write_behind": "disk_write_behind",
}


def _set(section: BaseModel, names: dict[str, str]) -> dict[str, Any]:
    """The section's given (non-None) keys, renamed to EngineConfig fields."""
    given = section.model_dump(exclude_none=True, exclude={"disk", "config"})
    return {names.get(key, key): value for key, value in given.items()}


def config_values(parsed: EngineYaml) -> dict[str, Any]:
    """EngineConfig keyword arguments of a parsed file."""
    values: dict[str, Any] = parsed.engine.model_dump(exclude_none=True)
    if parsed.model.name:
        values["model"] = parsed.model.name
    if parsed.model.path:
        values["model_path"] = parsed.model.path
    values.update(_set(parsed.model.config, {}))
    for key in ("max_batch_size", "kv_cache_dtype", "ranks_per_pod", "tensor_parallel"):
        if getattr(parsed, key) is not None:
            values[key] = getattr(parsed, key)
    values.update(_set(parsed.reuse, REUSE_FIELDS))
    values.update(_set(parsed.kv_tiers, TIER_FIELDS))
    disk = parsed.kv_tiers.disk
    values.update(_set(disk, DISK_FIELDS))
    if not disk.enabled:
        # NOTE: the dir stays unset too: the hand-off's disk transport keys on it alone.
        values.pop("disk_tier_dir", None)
    return values


def _problems(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "engine.yaml"
        what = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        lines.append(f"{where}: {what}")
    return "; ".join(lines)


def engine_config_from_dict(data: dict[str, Any]) -> EngineConfig:
    """Map the operator's engine.yaml layout onto EngineConfig; unknown keys are a ValueError."""
    try:
        parsed = EngineYaml.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_problems(exc)) from None
    return EngineConfig(**config_values(parsed))


def load_engine_config(path: str | Path) -> EngineConfig:
    """Read an engine.yaml; a missing file or a bad key is an error that names the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"engine config {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"engine config {path} must be a mapping, got {type(data).__name__}")
    try:
        return engine_config_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"engine config {path}: {exc}") from None
