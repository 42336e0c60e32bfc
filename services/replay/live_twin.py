"""The live twin of a simulator arm: CPU engine ranks configured exactly like a `SimConfig`.

The simulator's claim is that its prefix reuse is what real ranks would reuse. To check it,
the same arm runs on an `EmbeddedFleet` (the real router, real engine ranks with the tiny
model): same ranks, slots, step budget, page size, router affinity and wait bound, and the same
kvstore config per rank (life cycles, pages per pool, reuse policy, checkpoint), which is
proved by building both kvstore configs and comparing them (`TwinMismatch` otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...kvstore.config import KVStoreConfig
from ..router.admission import AdmissionConfig
from ..router.store import StoreIntegrityError
from .grpc_target import RouterGenerateTarget
from .sim_config import SimConfig

# Simulator options the live fleet does not mirror, and the value they must have.
UNMIRRORED_DEFAULTS: Mapping[str, Any] = {
    "host_pages": 0,
    "host_gib": 0.0,
    "disk_pages": 0,
    "placement": "load",
}


class TwinMismatch(ValueError):
    """The live fleet cannot be configured like the simulator arm."""


@dataclass(frozen=True)
class TwinSettings:
    """What the live side needs besides the arm: the model preset and how pins are kept."""

    model: str = "tiny"
    redis_url: str | None = "redis://127.0.0.1:6379/0"
    torch_threads: int = 1
    request_timeout_s: float = 120.0


def sim_kvstore_config(sim: SimConfig) -> KVStoreConfig:
    """The kvstore config one simulated rank runs with (every rank has the same one)."""
    from .sim_fleet import SimFleet

    fleet = SimFleet(replace(sim, fleet=replace(sim.fleet, ranks=1)))
    return next(iter(fleet.ranks.values())).manager.config


def admission_config(sim: SimConfig) -> AdmissionConfig:
    """The router's admission settings of the arm."""
    options = sim.fleet
    return AdmissionConfig(
        affinity=options.affinity,
        placement=options.placement,
        max_wait_passes=options.max_wait_passes,
        max_wait_seconds=options.max_wait_seconds,
        rehome_below=options.rehome_below,
    )


def engine_config(sim: SimConfig, settings: TwinSettings) -> Any:
    """An `EngineConfig` whose kvstore config equals the simulator rank's; raise TwinMismatch
    when an option cannot be mirrored or the two kvstore configs differ."""
    from ..engine.config.engine_config import EngineConfig
    from ..engine.config.model_config import preset
    from ..engine.kv.kv_setup import kvstore_config

    options = sim.fleet
    for name, value in UNMIRRORED_DEFAULTS.items():
        if getattr(options, name) != value:
            raise TwinMismatch(
                f"fleet.{name}={getattr(options, name)!r}: live twin needs {value!r}"
            )
    wanted = sim_kvstore_config(sim)
    replays = {lc.replay_tokens for lc in wanted.life_cycles if lc.kind == "window"}
    config = EngineConfig(
        model=settings.model,
        max_batch_size=options.slots,
        max_num_batched_tokens=options.chunk_tokens,
        page_size=options.block_size,
        kv_pool_pages=tuple(wanted.pool_pages.items()),
        reuse_policy=options.reuse_policy,
        max_num_turns=options.max_num_turns,
        keep_root=options.keep_root,
        keep_branch_points=options.keep_branch_points,
        discover_branch_points=options.discover_branch_points,
        checkpoint=options.checkpoint,
        checkpoint_margin_tokens=wanted.checkpoint_margin_tokens,
        window_replay_tokens=max(replays, default=0),
        torch_threads=settings.torch_threads,
    )
    live = kvstore_config(preset(settings.model), config)
    differences = _differences(wanted, live)
    if differences:
        raise TwinMismatch(f"live kvstore config differs from the simulator's: {differences}")
    return config


def _differences(sim: KVStoreConfig, live: KVStoreConfig) -> dict[str, tuple[Any, Any]]:
    """Fields of the two kvstore configs that differ, as (sim, live)."""
    pairs = {
        "block_size": (sim.block_size, live.block_size),
        "life_cycles": (sim.life_cycles, live.life_cycles),
        "pool_pages": (dict(sim.pool_pages), dict(live.pool_pages)),
        "reuse_policy": (repr(sim.reuse_policy), repr(live.reuse_policy)),
        "checkpoint": (sim.checkpoint, live.checkpoint),
        "checkpoint_margin_tokens": (sim.checkpoint_margin_tokens, live.checkpoint_margin_tokens),
    }
    return {name: pair for name, pair in pairs.items() if pair[0] != pair[1]}


class LiveTwin:
    """An embedded fleet (router + CPU ranks) running a simulator arm; `close` checks every
    rank's kvstore and the router's reservations."""

    def __init__(self, sim: SimConfig, settings: TwinSettings | None = None) -> None:
        from ..fleet.embedded import EmbeddedFleet, FleetConfig

        self.settings = settings or TwinSettings()
        self.engine = engine_config(sim, self.settings)
        config = FleetConfig(
            engine=self.engine,
            num_ranks=sim.fleet.ranks,
            redis_url=self.settings.redis_url,
            admission=admission_config(sim),
        )
        self.fleet = EmbeddedFleet(config)

    def start(self, timeout: float = 30.0) -> LiveTwin:
        """Start router and ranks; return once every rank registered."""
        try:
            self.fleet.start(timeout)
        except BaseException:
            self.fleet.stop()
            raise
        return self

    def target(self) -> RouterGenerateTarget:
        """A replay target that sends to this fleet's router."""
        address = f"grpc://{self.fleet.router_address}"
        return RouterGenerateTarget(address, timeout_s=self.settings.request_timeout_s)

    def check_integrity(self) -> None:
        """Every rank's kvstore adds up and the router holds no reservation (idle fleet)."""
        for rank in self.fleet.ranks:
            rank.core.check_integrity()
        store = self.fleet.router.runtime.store
        store.check_integrity()
        busy = {rank_id: s.used for rank_id, s in self.fleet.router.runtime.ranks().items()}
        if any(busy.values()):
            raise StoreIntegrityError(f"router still reserves slots after the run: {busy}")

    def close(self) -> None:
        """Check integrity, then stop everything (stops even when the check raises)."""
        try:
            self.check_integrity()
        finally:
            self.fleet.stop()
