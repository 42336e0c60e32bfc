"""The one place that sizes and allocates an engine's KV: kvstore life cycles, pools, storage.

The model's layer groups (`full`, `window`) map one to one onto kvstore life cycles of the
same names, so a page id from the manager's page table indexes the same group's K/V tensors.
Pool sizes come from kvstore's `plan_pools` for a typical step of this rank (its slots, the
model's context, the step budget, the retained turns) unless `kv_pages` fixes them.
NOTE: when kvstore grows a device KV storage object (tiers), swap `PagedKVCache` here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle, LifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import REUSE_POLICIES, make_reuse_policy
from kvfleet.kvstore.sizing import TypicalStep, plan_pools

from .config import FULL_GROUP, WINDOW_GROUP, ModelConfig
from .engine_config import EngineConfig
from .kv_cache import PagedKVCache


def life_cycles_for(model: ModelConfig, config: EngineConfig) -> tuple[LifeCycle, ...]:
    """One kvstore life cycle per model layer group."""
    makers = {
        FULL_GROUP: lambda: FullLifeCycle(FULL_GROUP),
        WINDOW_GROUP: lambda: WindowLifeCycle(
            WINDOW_GROUP, model.window_size, replay_tokens=config.window_replay_tokens
        ),
    }
    return tuple(makers[group]() for group in model.groups)


def typical_step(model: ModelConfig, config: EngineConfig) -> TypicalStep:
    """A rank's peak: every slot at the model's context, plus retained turns per slot."""
    retained = config.max_batch_size * config.max_num_turns
    retains = make_reuse_policy(config.reuse_policy, **_policy_params(config)).retained_turns
    return TypicalStep(
        num_slots=config.max_batch_size,
        max_context_tokens=model.max_position,
        chunk_tokens=config.max_num_batched_tokens,
        retained_turns=retained if retains else 0,
        checkpoint=config.checkpoint,
    )


def kvstore_config(model: ModelConfig, config: EngineConfig) -> KVStoreConfig:
    """The manager's config: block size = page size, pools sized for the typical step."""
    life_cycles = life_cycles_for(model, config)
    if config.kv_pages is not None:
        pool_pages = {lc.name: config.kv_pages for lc in life_cycles}
    else:
        step = typical_step(model, config)
        pool_pages = dict(plan_pools(step, life_cycles, config.page_size).pool_pages)
    return KVStoreConfig(
        block_size=config.page_size,
        life_cycles=life_cycles,
        pool_pages=pool_pages,
        reuse_policy=make_reuse_policy(config.reuse_policy, **_policy_params(config)),
        checkpoint=config.checkpoint,
        checkpoint_margin_tokens=config.checkpoint_margin_tokens,
    )


@dataclass(frozen=True)
class KVSetup:
    """The manager's config and the tensors that hold the pages it hands out."""

    store_config: KVStoreConfig
    storage: PagedKVCache | None


def build_kv(
    model: ModelConfig, config: EngineConfig, device: str, dtype: torch.dtype, with_storage: bool
) -> KVSetup:
    """Size the pools and (for a tensor backend) allocate their K/V storage."""
    store_config = kvstore_config(model, config)
    storage = None
    if with_storage:
        storage = PagedKVCache(
            model,
            dict(store_config.pool_pages),
            config.page_size,
            device=device,
            dtype=dtype,
            null_page_id=0,
        )
    return KVSetup(store_config, storage)


def _policy_params(config: EngineConfig) -> dict[str, int]:
    """Pass max_num_turns only to the policies that take it (no branching on names)."""
    factory = REUSE_POLICIES.get(config.reuse_policy)
    takes_turns = factory is not None and "max_num_turns" in inspect.signature(factory).parameters
    return {"max_num_turns": config.max_num_turns} if takes_turns else {}
