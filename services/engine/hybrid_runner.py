"""Greedy generation of a hybrid model (`models/hybrid.py`) over the kvstore's pools and tiers.

Attention layers keep K/V in the `full` life cycle's pages; SSM layers keep their recurrent
state in the `ssm` state life cycle: the page of block j holds every SSM layer's state after
token (j+1)*B - 1 once block j is computed (the running state before that). A state is packed
into the attention page shape (`[2, page_size, kv_heads, head_dim]` per layer, fp32), so the
tiers offload and onboard state pages like any other page. A prefix match resumes from the
snapshot at the matched block and the attention pages before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...kvstore.block_pool import NULL_PAGE
from ...kvstore.config import KVStoreConfig
from ...kvstore.life_cycles import FullLifeCycle, StateLifeCycle
from ...kvstore.manager import KVCacheManager
from ...kvstore.policies import ReusePolicy
from ...kvstore.tiers.build import TierConfig, build_tiers
from ...kvstore.tiers.layout import KVLayout
from .models.hybrid import HybridLM
from .models.ssm import SSMState

ATTENTION_POOL, STATE_POOL = "full", "ssm"


@dataclass(frozen=True)
class HybridCacheConfig:
    """Pages and snapshot boundaries of a hybrid model's two pools."""

    page_size: int = 8
    pages: int = 64
    host_pages: int = 0
    every_tokens: int = 0
    offsets_from_end: tuple[int, ...] = (0,)
    chunk_tokens: int = 16


class HybridRunner:
    """One rank's hybrid model, manager and tiers; `generate` runs one request at a time."""

    def __init__(self, model: HybridLM, policy: ReusePolicy, cache: HybridCacheConfig) -> None:
        config = model.config
        self.model, self.cache, self.bs = model, cache, cache.page_size
        base = config.base
        self.layout = KVLayout(
            page_size=cache.page_size,
            kv_heads=base.num_kv_heads,
            head_dim=base.head_dim,
            layers={ATTENTION_POOL: config.attention_layers, STATE_POOL: config.ssm_layers},
            dtype="float32",
        )
        page_floats = 2 * cache.page_size * base.num_kv_heads * base.head_dim
        if config.ssm.state_numel > page_floats:
            raise ValueError(
                f"an SSM state of {config.ssm.state_numel} floats does not fit a page of "
                f"{page_floats} (raise page_size)"
            )
        life_cycles = (
            FullLifeCycle(ATTENTION_POOL),
            StateLifeCycle(STATE_POOL, cache.every_tokens, cache.offsets_from_end),
        )
        store = KVStoreConfig(
            block_size=cache.page_size,
            life_cycles=life_cycles,
            pool_pages={lc.name: cache.pages for lc in life_cycles},
            reuse_policy=policy,
            checkpoint=True,
            checkpoint_margin_tokens=cache.page_size,
        )
        host = {lc.name: cache.host_pages for lc in life_cycles}
        tiers = build_tiers(store, TierConfig(host_pages=host), self.layout, device="cpu")
        self.manager = KVCacheManager(store, tiers=tiers)
        self.device_kv = tiers.device_kv
        self.reused: dict[str, int] = {}

    def generate(
        self, request_id: str, prompt: Sequence[int], conversation_id: str, max_tokens: int
    ) -> list[int]:
        """Greedy tokens after `prompt`, resuming from the longest cached prefix."""
        manager = self.manager
        manager.add_request(request_id, prompt, conversation_id)
        done = manager.match(request_id).num_reusable_tokens
        first = min(self.cache.chunk_tokens, len(prompt) - done)
        manager.admit(request_id, first)
        done = self.reused[request_id] = manager.progress(request_id).num_reused_tokens
        states = self._read_states(request_id, done)
        tokens, output, size = list(prompt), [], first
        while len(output) < max_tokens:
            chunk = torch.tensor(tokens[done : done + size])
            result = self.model.forward_chunk(
                chunk, done, self._read_kv(request_id, done), states, self._block_ends(done, size)
            )
            self._write(request_id, done, result)
            states, done = result.states, done + size
            manager.commit(request_id, done)
            if done < len(prompt):
                size = min(self.cache.chunk_tokens, len(prompt) - done)
                manager.allocate(request_id, size)
                continue
            if done == len(prompt):
                manager.finish_context(request_id)
            output.append(int(result.logits[-1].argmax()))
            if len(output) == max_tokens:
                break
            tokens.append(output[-1])
            manager.append_tokens(request_id, output[-1:])
            size = 1
            manager.allocate(request_id, size)
        manager.finish_request(request_id)
        manager.check_integrity()
        return output

    def _block_ends(self, start: int, size: int) -> frozenset[int]:
        """Chunk indices of the tokens that end a block."""
        return frozenset(t - start for t in range(start, start + size) if (t + 1) % self.bs == 0)

    def _read_kv(self, request_id: str, num_tokens: int) -> dict[int, tuple[torch.Tensor, ...]]:
        pages = self.manager.page_table(request_id, ATTENTION_POOL)[: -(-num_tokens // self.bs)]
        storage = self.device_kv.storage(ATTENTION_POOL)
        index = torch.tensor(pages, dtype=torch.long)
        out = {}
        for slot, layer in enumerate(self.layout.layers[ATTENTION_POOL]):
            k, v = (storage[slot, kv].index_select(0, index).flatten(0, 1) for kv in (0, 1))
            out[layer] = (k[:num_tokens], v[:num_tokens])
        return out

    def _read_states(self, request_id: str, num_tokens: int) -> dict[int, SSMState]:
        if num_tokens == 0:
            return self.model.initial_states()
        page = self.manager.page_table(request_id, STATE_POOL)[num_tokens // self.bs - 1]
        if page == NULL_PAGE:
            raise RuntimeError(f"request {request_id!r}: no state snapshot at {num_tokens}")
        storage, shape = self.device_kv.storage(STATE_POOL), self.model.config.ssm
        return {
            layer: SSMState.from_flat(shape, storage[slot, :, page].flatten())
            for slot, layer in enumerate(self.layout.layers[STATE_POOL])
        }

    def _write(self, request_id: str, start: int, result) -> None:
        """K/V of the chunk's tokens, each block-end snapshot and the running state."""
        full = self.manager.page_table(request_id, ATTENTION_POOL)
        storage = self.device_kv.storage(ATTENTION_POOL)
        positions = range(start, start + next(iter(result.kv.values()))[0].shape[0])
        slots = torch.tensor([full[p // self.bs] * self.bs + p % self.bs for p in positions])
        for slot, layer in enumerate(self.layout.layers[ATTENTION_POOL]):
            for kv, values in enumerate(result.kv[layer]):
                storage[slot, kv].flatten(0, 1).index_copy_(0, slots, values.float())
        table = self.manager.page_table(request_id, STATE_POOL)
        last = positions[-1]
        snapshots = {start + i: i for i in next(iter(result.kept.values()), {})}
        for slot, layer in enumerate(self.layout.layers[STATE_POOL]):
            kept = result.kept[layer]
            for position, index in snapshots.items():
                self._put_state(table[position // self.bs], slot, kept[index])
            self._put_state(table[last // self.bs], slot, result.states[layer])

    def _put_state(self, page: int, slot: int, state: SSMState) -> None:
        target = self.device_kv.storage(STATE_POOL)[slot, :, page]
        flat = torch.zeros(target.numel())
        flat[: self.model.config.ssm.state_numel] = state.flat()
        target.copy_(flat.view(target.shape))
