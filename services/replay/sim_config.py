"""The simulator's settings: model shape, hardware figures and fleet options, from YAML + spec.

A `--target` spec is `sim`, `sim:PATH.yaml`, and either may end in `?key=value&...` to
override fleet options (`sim?ranks=2&slots=4&affinity=lenient`). Defaults come from the
packaged `sim_costs.yaml` (`kvfleet.services.core`); a PATH file is merged over them section
by section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import yaml

from ..core.cost_figures import (
    Hardware,
    ModelShape,
    SimConfigError,
    default_figures,
)
from ..core.kv_cache_dtype import KV_CACHE_DTYPES
from ..core.kv_cache_dtype import kv_dtype_bytes as element_bytes


@dataclass(frozen=True)
class FleetOptions:
    """Ranks, slots, pages per tier, and the router and kvstore policies of the fleet."""

    ranks: int = 4
    context_ranks: int = 0  # both pools > 0: disaggregated (`ranks` is then unused)
    generation_ranks: int = 0
    slots: int = 8
    block_size: int = 64
    gpu_pages: int = 12800
    host_pages: int = 0
    disk_pages: int = 0
    gpu_gib: float = 0.0  # > 0: device KV bytes per rank, split by bytes (gpu_pages unused)
    kv_cache_dtype: str = "auto"  # auto (the model's dtype_bytes) | bf16 | fp8_e4m3: page bytes
    host_gib: float = 0.0  # > 0: host tier bytes per rank, split like the device bytes
    host_exclusive: bool = True  # a block onboarded from host leaves it (kvstore/tiers/stack)
    # the disk tiers are one volume every rank reads and writes, as the operator mounts one
    # (a rank finds blocks another wrote); False: each rank's disk holds its own blocks only
    disk_shared: bool = True
    chunk_tokens: int = 8192
    max_context_tokens: int = 131072
    affinity: str = "strict"
    max_wait_passes: int = 1_000_000
    max_wait_seconds: float = 30.0
    placement: str = "load"
    rehome_below: float = 0.0  # router: a pinned turn whose home lost more is placed anew
    reuse_policy: str = "per_conversation"
    max_num_turns: int = 5
    keep_root: bool = False  # per_conversation: also keep the first turn's endpoints
    keep_branch_points: int = 2  # per_conversation: branch records kept (kvstore/branch_points)
    discover_branch_points: bool = False  # ... also where an unhinted turn's cached run stops
    retained_conversations: int = 8
    checkpoint: bool = True
    retained_snapshot_sizing: bool = True  # pools count retained turns' from-end snapshots
    tick_seconds: float = 0.05
    max_decode_run_steps: int = 64
    # the engine's `onboard_pages_per_step`: a request whose match has more host/disk pages,
    # admitted while others run, brings this many up a step first (sim_onboard_ahead.py; 0:
    # all at its admission); only with the admission's per-page figures (else: at once)
    onboard_pages_per_step: int = 256
    ranks_per_chip: int = 1  # > 1: that many ranks share one accelerator (sim_chip.py)
    prefetch: bool = False  # router-driven prefetch: held blocks for a returning turn
    # a turn placed away from its home pulls the home's blocks; off as in the product, whose
    # ranks do not pull yet (a simulator default on would predict reuse no fleet gets)
    migrate_kv: bool = False
    drain_rank: str = ""  # scale-in: this rank drains at `drain_at_s` (virtual seconds)
    drain_at_s: float = 0.0
    step_log: str = ""  # a folder: every rank logs its steps there (sim_step_log.py)

    def __post_init__(self) -> None:
        positive = (
            "ranks",
            "slots",
            "block_size",
            "chunk_tokens",
            "max_context_tokens",
            "max_num_turns",
            "max_decode_run_steps",
            "ranks_per_chip",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise SimConfigError(f"fleet.{name}: {getattr(self, name)} must be >= 1")
        if self.gpu_pages < 2:
            raise SimConfigError(f"fleet.gpu_pages: {self.gpu_pages} must be >= 2 (1 is null)")
        if self.retained_conversations < 0:
            raise SimConfigError(
                f"fleet.retained_conversations: {self.retained_conversations} must be >= 0"
            )
        if self.gpu_gib < 0 or self.host_gib < 0:
            raise SimConfigError(
                f"fleet.gpu_gib={self.gpu_gib}, host_gib={self.host_gib} must be >= 0"
            )
        if self.host_pages < 0 or self.disk_pages < 0:
            raise SimConfigError(
                f"fleet.host_pages={self.host_pages}, disk_pages={self.disk_pages} must be >= 0"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise SimConfigError(
                f"fleet.kv_cache_dtype: {self.kv_cache_dtype!r} not in {sorted(KV_CACHE_DTYPES)}"
            )
        if self.onboard_pages_per_step < 0:
            raise SimConfigError(
                f"fleet.onboard_pages_per_step: {self.onboard_pages_per_step} must be >= 0"
            )
        if self.tick_seconds <= 0:
            raise SimConfigError(f"fleet.tick_seconds: {self.tick_seconds} must be > 0")
        pools = (self.context_ranks, self.generation_ranks)
        if min(pools) < 0 or (0 in pools and pools != (0, 0)):
            raise SimConfigError(
                f"fleet.context_ranks={self.context_ranks}, generation_ranks="
                f"{self.generation_ranks}: both 0 (aggregated) or both >= 1 (disaggregated)"
            )

    @property
    def disaggregated(self) -> bool:
        """True when the fleet has a context pool and a generation pool."""
        return self.context_ranks > 0


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulated fleet is built from."""

    model: ModelShape
    hardware: Hardware
    fleet: FleetOptions = field(default_factory=FleetOptions)

    def kv_dtype_bytes(self) -> int:
        """Bytes of one KV element: the fleet's `kv_cache_dtype`, `auto` the model's."""
        return kv_dtype_bytes(self.fleet, self.model)

    def page_bytes(self) -> dict[str, int]:
        """Bytes of one page per life cycle in the fleet's KV dtype."""
        return self.model.page_bytes(self.fleet.block_size, self.kv_dtype_bytes())

    def to_json(self) -> dict[str, Any]:
        """Plain data, for the replay's `config`."""
        return dataclasses.asdict(self)


def kv_dtype_bytes(fleet: FleetOptions, model: ModelShape) -> int:
    """Bytes of one KV element of `fleet`'s pages (`auto`: the model's `dtype_bytes`)."""
    return element_bytes(fleet.kv_cache_dtype, model.dtype_bytes)


def load_sim_config(path: Path | None = None, overrides: dict[str, str] | None = None) -> SimConfig:
    """Defaults, merged with the YAML at `path` per section, then fleet `overrides`."""
    raw = default_figures()
    if path is not None:
        extra = yaml.safe_load(Path(path).read_text()) or {}
        unknown = set(extra) - set(raw)
        if unknown:
            raise SimConfigError(f"{path}: unknown sections {sorted(unknown)}; known {sorted(raw)}")
        for section, values in extra.items():
            raw[section] = {**raw[section], **(values or {})}
    fleet = {**raw["fleet"], **_coerce_fleet(overrides or {})}
    try:
        return SimConfig(
            model=ModelShape(**{**raw["model"], "life_cycles": tuple(raw["model"]["life_cycles"])}),
            hardware=Hardware(**raw["hardware"]),
            fleet=FleetOptions(**fleet),
        )
    except TypeError as error:
        raise SimConfigError(f"simulator settings: {error}") from error


def parse_sim_spec(spec: str) -> tuple[Path | None, dict[str, str]]:
    """`sim[:PATH][?k=v&...]` -> (PATH or None, overrides)."""
    if spec != "sim" and not spec.startswith(("sim:", "sim?")):
        raise SimConfigError(f"target {spec!r}: a simulator spec starts with 'sim'")
    rest = spec[3:]
    rest, _, query = rest.partition("?")
    path = Path(rest[1:]) if rest.startswith(":") and rest[1:] else None
    return path, dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))


_BOOLEANS = {"1": True, "true": True, "on": True, "yes": True}
_BOOLEANS |= {"0": False, "false": False, "off": False, "no": False}


def _coerce_fleet(overrides: dict[str, str]) -> dict[str, Any]:
    """Turn query-string values into the types of FleetOptions' fields."""
    types = {item.name: item.type for item in fields(FleetOptions)}
    coerced: dict[str, Any] = {}
    for key, text in overrides.items():
        if key not in types:
            raise SimConfigError(f"sim option {key!r} unknown; known: {sorted(types)}")
        kind = types[key]
        try:
            if kind == "bool":
                coerced[key] = _BOOLEANS[text.lower()]
            elif kind == "int":
                coerced[key] = int(text)
            elif kind == "float":
                coerced[key] = float(text)
            else:
                coerced[key] = text
        except (KeyError, ValueError):
            raise SimConfigError(f"sim option {key}={text!r} is not a {kind}") from None
    return coerced
