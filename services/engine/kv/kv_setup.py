"""The one place that sizes and allocates an engine's KV: kvstore life cycles, pools, tiers.

The model's layer groups (`full`, `window`) map one to one onto kvstore life cycles of the
same names, so a page id from the manager's page table indexes the same group's K/V tensors.
Pool sizes come from kvstore's `plan_pools` for the typical step of this rank (kvstore's
`rank_typical_step`: its slots, the model's context, the step budget, the retained turns),
within the device KV's byte budget (kv_budget.py), unless `kv_pages` fixes them. The K/V
tensors are the kvstore tiers' device KV (`open_kv_tiers`), under which sit a host tier and the
shared disk tier, each split for what it holds (`plan_lower_tier`: conversations between turns,
not the device's residents); the model reads them through `DeviceKVCache`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ....kvstore.config import KVStoreConfig
from ....kvstore.life_cycles import FullLifeCycle, LifeCycle, StateLifeCycle, WindowLifeCycle
from ....kvstore.policies import REUSE_POLICIES, make_reuse_policy
from ....kvstore.sizing import (
    TypicalStep,
    plan_lower_tier,
    plan_pool_bytes,
    plan_pools,
    rank_typical_step,
)
from ....kvstore.tiers.build import TierConfig, build_tiers
from ....kvstore.tiers.layout import KVLayout
from ....kvstore.tiers.stack import KVTiers
from ...core.kv_cache_dtype import kv_dtype_name
from ...core.model_disk import model_disk_root
from ..config.engine_config import EngineConfig
from ..config.model_config import FULL_GROUP, STATE_GROUP, WINDOW_GROUP, ModelConfig
from .kv_budget import KVBudget

log = logging.getLogger(__name__)

GIB = 1 << 30


def life_cycles_for(model: ModelConfig, config: EngineConfig) -> tuple[LifeCycle, ...]:
    """One kvstore life cycle per model layer group."""
    makers = {
        FULL_GROUP: lambda: FullLifeCycle(FULL_GROUP),
        WINDOW_GROUP: lambda: WindowLifeCycle(
            WINDOW_GROUP, model.window_size, replay_tokens=config.window_replay_tokens
        ),
        STATE_GROUP: lambda: StateLifeCycle(
            STATE_GROUP, config.state_every_tokens, config.state_offsets_from_end
        ),
    }
    return tuple(makers[group]() for group in model.groups)


def typical_step(model: ModelConfig, config: EngineConfig) -> TypicalStep:
    """A rank's peak by kvstore's rule (`rank_typical_step`, which the simulator uses too):
    every slot at the model's context, plus the retained turns of `retained_conversations`
    conversations (default: one per slot)."""
    conversations = config.retained_conversations
    return rank_typical_step(
        config.max_batch_size,
        model.max_position,
        config.max_num_batched_tokens,
        config.max_batch_size if conversations is None else conversations,
        make_reuse_policy(config.reuse_policy, **_policy_params(config)),
        config.checkpoint,
    )


def kvstore_config(
    model: ModelConfig,
    config: EngineConfig,
    budget: KVBudget | None = None,
    layout: KVLayout | None = None,
) -> KVStoreConfig:
    """The manager's config: block size = page size, pools sized for the typical step (within
    `budget`, whose bytes `layout` gives per page; None: the whole peak)."""
    life_cycles = life_cycles_for(model, config)
    if config.kv_pages is not None:
        pool_pages = {lc.name: config.kv_pages for lc in life_cycles}
    else:
        step = typical_step(model, config)
        pool_pages = budget_pool_pages(step, life_cycles, config.page_size, budget, layout)
    unknown = set(dict(config.kv_pool_pages)) - set(pool_pages)
    if unknown:
        raise ValueError(f"kv_pool_pages: pools {sorted(unknown)} not in {sorted(pool_pages)}")
    pool_pages.update(config.kv_pool_pages)
    return KVStoreConfig(
        block_size=config.page_size,
        life_cycles=life_cycles,
        pool_pages=pool_pages,
        reuse_policy=make_reuse_policy(config.reuse_policy, **_policy_params(config)),
        checkpoint=config.checkpoint,
        checkpoint_margin_tokens=config.checkpoint_margin_tokens,
    )


def budget_pool_pages(
    step: TypicalStep,
    life_cycles: tuple[LifeCycle, ...],
    page_size: int,
    budget: KVBudget | None,
    layout: KVLayout | None,
) -> dict[str, int]:
    """The typical step's peak pages when they fit `budget`, else the budget's pages split by
    the typical step (`plan_pools`, as the simulator splits its gpu_pages), with a warning."""
    peak = dict(plan_pools(step, life_cycles, page_size).pool_pages)
    if budget is None or layout is None:
        return peak
    page_bytes = {name: layout.page_bytes(name) for name in peak}
    peak_bytes = sum(pages * page_bytes[name] for name, pages in peak.items())
    if peak_bytes <= budget.budget_bytes:
        log.info(
            "device KV: the typical step's peak %s fits (%s)", _gib(peak_bytes), budget.explanation
        )
        return peak
    # The budget's bytes split between the pools by their pages' own bytes (a state page can
    # take tens of attention pages' bytes).
    try:
        plan = plan_pool_bytes(step, life_cycles, page_size, budget.budget_bytes, page_bytes)
    except ValueError as error:
        raise ValueError(
            f"device KV budget {budget.explanation} is too small for {len(peak)} pools: {error} "
            "(set kv_pages, or lower max_batch_size / max_num_batched_tokens)"
        ) from error
    pages = dict(plan.pool_pages)
    used = sum(count * page_bytes[name] for name, count in pages.items())
    log.warning(
        "device KV budget cannot hold the typical step's peak: %s of %s needed (%s slots at "
        "%d tokens, %d retained turns); pools %s of peak %s; budget %s",
        _gib(used),
        _gib(peak_bytes),
        step.num_slots,
        step.max_context_tokens,
        step.retained_turns,
        pages,
        peak,
        budget.explanation,
    )
    return pages


@dataclass(frozen=True)
class KVSetup:
    """The manager's config and the page layout every tier stores."""

    store_config: KVStoreConfig
    layout: KVLayout


def kv_cache_dtype(config: EngineConfig, model_dtype: torch.dtype) -> torch.dtype:
    """The pages' dtype: `config.kv_cache_dtype`, `auto` the weights' `model_dtype`."""
    name = kv_dtype_name(config.kv_cache_dtype, str(model_dtype).removeprefix("torch."))
    return getattr(torch, name)


def build_kv(
    model: ModelConfig,
    config: EngineConfig,
    dtype: torch.dtype,
    budget: KVBudget | None = None,
    scales_tag: str = "",
) -> KVSetup:
    """Size the pools within `budget` and describe their pages (nothing is allocated yet);
    `dtype` is the weights' (the pages' is `kv_cache_dtype`: an fp8 page is half a bf16
    page's bytes, so the same budget holds twice the pages)."""
    layout = kv_layout(model, config, dtype, scales_tag)
    return KVSetup(kvstore_config(model, config, budget, layout), layout)


def kv_layout(
    model: ModelConfig, config: EngineConfig, dtype: torch.dtype, scales_tag: str = ""
) -> KVLayout:
    """One page per life cycle: its layer group's layers, K and V, `page_size` tokens, in the
    `kv_cache_dtype` of a model whose weights are in `dtype`; a recurrent group's page holds
    one fp32 state per layer (bytes of its own, in any KV dtype). `scales_tag`: an fp8
    cache's `KVScales.tag()`."""
    state_bytes = {STATE_GROUP: model.ssm_state_floats * 4} if model.ssm_layers else {}
    return KVLayout(
        page_size=config.page_size,
        kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        layers=dict(model.groups),
        dtype=str(kv_cache_dtype(config, dtype)).removeprefix("torch."),
        state_bytes=state_bytes,
        scales_tag=scales_tag,
    )


def tier_pages(
    budget_bytes: float, step: TypicalStep, life_cycles: tuple[LifeCycle, ...], layout: KVLayout
) -> dict[str, int]:
    """Split a lower tier's bytes between life cycles for what it holds (`plan_lower_tier`:
    one conversation's context and its latest endpoint per life cycle, by page bytes)."""
    page_bytes = {lc.name: layout.page_bytes(lc.name) for lc in life_cycles}
    return plan_lower_tier(step, life_cycles, layout.page_size, int(budget_bytes), page_bytes)


def disk_tier_root(model: ModelConfig, config: EngineConfig) -> str:
    """This model's folder of the shared disk tier (`model_disk_root`); a tensor-parallel
    rank's blocks hold one worker's shard each, and an fp8 cache's blocks hold other bytes, so
    each such layout gets a folder of its own (fleets of two layouts would otherwise overwrite
    each other's blocks; a block of another layout is still a miss, never wrong bytes)."""
    root = model_disk_root(config.disk_tier_dir, model.name, config.model_path, config.seed)
    if config.kv_cache_dtype == "fp8_e4m3":
        root = os.path.join(root, "kv-fp8_e4m3")
    if config.tensor_parallel == 1:
        return root
    return os.path.join(root, f"tensor-parallel-{config.tensor_parallel}")


def tier_config(
    model: ModelConfig, config: EngineConfig, store_config: KVStoreConfig, layout: KVLayout
) -> TierConfig:
    """Host and disk pages per life cycle, the disk folder and the prefetch depth."""
    pools = dict(store_config.pool_pages)
    step = typical_step(model, config)
    lower = (pools, step, store_config.life_cycles, layout)
    host = _tier_pages(config.host_kv_pages, config.host_kv_gib, *lower)
    disk_dir = None
    disk = dict.fromkeys(pools, 0)
    if config.disk_tier_dir and config.disk_tier_enabled:
        disk = _tier_pages(config.disk_kv_pages, config.disk_kv_gib, *lower)
        if any(disk.values()):
            disk_dir = disk_tier_root(model, config)
        else:
            log.warning("disk tier %s has no capacity: no disk tier", config.disk_tier_dir)
    return TierConfig(
        host_pages=host,
        disk_pages=disk if disk_dir else {},
        disk_dir=disk_dir,
        disk_prefetch_num_reqs=config.disk_prefetch_num_reqs,
        disk_read_threads=config.disk_read_threads,
        host_exclusive=config.host_kv_exclusive,
        disk_write_behind=config.disk_write_behind,
    )


def open_kv_tiers(
    model: ModelConfig, config: EngineConfig, kv: KVSetup, device: torch.device | str
) -> KVTiers:
    """Allocate a fresh device KV with its host and disk tiers, for one manager."""
    tiers = tier_config(model, config, kv.store_config, kv.layout)
    return build_tiers(kv.store_config, tiers, kv.layout, device)


def _tier_pages(
    pages: int | None,
    gib: float,
    device_pages: Mapping[str, int],
    step: TypicalStep,
    life_cycles: tuple[LifeCycle, ...],
    layout: KVLayout,
) -> dict[str, int]:
    if pages is not None:
        return dict.fromkeys(device_pages, pages)
    return tier_pages(gib * GIB, step, life_cycles, layout)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def _policy_params(config: EngineConfig) -> dict[str, int | bool]:
    """Pass max_num_turns, keep_root and keep_branch_points only to the policies that take
    them (no branching on names)."""
    factory = REUSE_POLICIES.get(config.reuse_policy)
    taken = inspect.signature(factory).parameters if factory is not None else {}
    values = {
        "max_num_turns": config.max_num_turns,
        "keep_root": config.keep_root,
        "keep_branch_points": config.keep_branch_points,
        "discover_branch_points": config.discover_branch_points,
    }
    return {name: value for name, value in values.items() if name in taken}
