"""How a simulated rank's kvstore is sized: its reuse policy, device pools and lower tiers.

The device pools are split by the kvstore's own sizing rule for the typical step kvstore builds
from the fleet's options (`rank_typical_step`, as the engine does): `gpu_pages` pages by count
(`plan_pools`), or with `gpu_gib` the rank's bytes by each pool's page bytes
(`plan_pool_bytes`: an SSM state page is tens of attention pages). The host and disk tiers are
split for what they hold (`plan_lower_tier`: conversations between turns, no resident
request), by bytes with `host_gib`, else by pages. Page bytes are in the fleet's
`kv_cache_dtype`, so an fp8 fleet's `gpu_gib` / `host_gib` hold twice the pages.
"""

from __future__ import annotations

from ...kvstore.config import KVStoreConfig
from ...kvstore.policies import ReusePolicy, make_reuse_policy
from ...kvstore.sizing import (
    TypicalStep,
    plan_lower_tier,
    plan_pool_bytes,
    plan_pools,
    rank_typical_step,
)
from ...kvstore.tiers.disk_files import SharedBlockSet
from ...kvstore.tiers.stack import KVTiers
from ..core.cost_figures import ModelShape
from .sim_config import FleetOptions, kv_dtype_bytes

GIB = 1 << 30


def rank_kvstore(
    fleet: FleetOptions, model: ModelShape, shared_disk: SharedBlockSet | None = None
) -> tuple[KVStoreConfig, KVTiers | None]:
    """A new rank's kvstore config and its host/disk tiers (None without lower tiers); its disk
    tier's blocks go in `shared_disk` where given (the fleet's one volume), else in its index
    alone."""
    life_cycles = model.build_life_cycles()
    policy = rank_policy(fleet)
    step = typical_step(fleet, policy)
    page_bytes = model.page_bytes(fleet.block_size, kv_dtype_bytes(fleet, model))
    if fleet.gpu_gib > 0:
        budget = int(fleet.gpu_gib * GIB)
        plan = plan_pool_bytes(step, life_cycles, fleet.block_size, budget, page_bytes)
    else:
        plan = plan_pools(step, life_cycles, fleet.block_size, fleet.gpu_pages)
    pool_pages = dict(plan.pool_pages)
    kv_config = KVStoreConfig(
        fleet.block_size, life_cycles, pool_pages, policy, checkpoint=fleet.checkpoint
    )
    if not (fleet.host_pages or fleet.host_gib or fleet.disk_pages):
        return kv_config, None
    bs = fleet.block_size
    if fleet.host_gib > 0:
        host = plan_lower_tier(step, life_cycles, bs, int(fleet.host_gib * GIB), page_bytes)
    else:
        host = plan_lower_tier(step, life_cycles, bs, fleet.host_pages)
    tiers = KVTiers(
        host,
        plan_lower_tier(step, life_cycles, bs, fleet.disk_pages),
        dict.fromkeys((lc.name for lc in life_cycles), 0),
        disk_files=shared_disk,
        host_exclusive=fleet.host_exclusive,
    )
    return kv_config, tiers


def rank_policy(fleet: FleetOptions) -> ReusePolicy:
    """The rank's kvstore reuse policy, from the fleet's options."""
    policy_params = {
        "max_num_turns": fleet.max_num_turns,
        "keep_root": fleet.keep_root,
        "keep_branch_points": fleet.keep_branch_points,
        "discover_branch_points": fleet.discover_branch_points,
    }
    if fleet.reuse_policy != "per_conversation":
        policy_params = {}
    return make_reuse_policy(fleet.reuse_policy, **policy_params)


def typical_step(fleet: FleetOptions, policy: ReusePolicy) -> TypicalStep:
    """The step a rank's pools are split for: kvstore's rule, from the fleet's options."""
    return rank_typical_step(
        fleet.slots,
        fleet.max_context_tokens,
        fleet.chunk_tokens,
        fleet.retained_conversations,
        policy,
        fleet.checkpoint,
        fleet.retained_snapshot_sizing,
    )
