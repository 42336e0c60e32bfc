"""Tiered managers with real bytes on CPU, and KV contents that identify their block."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence

import torch
from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.events import KVEvent
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import FullLifeCycle, LifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import AllReusable, ReusePolicy
from kvfleet.kvstore.tiers.build import TierConfig, build_tiers
from kvfleet.kvstore.tiers.layout import KVLayout

torch.set_num_threads(1)
BLOCK = 4
# The GPU copy path runs these tests too: KVFLEET_TIER_TEST_DEVICE=cuda on a machine with one.
DEVICE = os.environ.get("KVFLEET_TIER_TEST_DEVICE", "cpu")


def make_layout(
    life_cycles: Sequence[LifeCycle], dtype: str = "float32", scales_tag: str = ""
) -> KVLayout:
    """Two layers per life cycle, 2 KV heads of 8 dims, pages of BLOCK tokens."""
    layers = {lc.name: (2 * i, 2 * i + 1) for i, lc in enumerate(life_cycles)}
    return KVLayout(
        page_size=BLOCK, kv_heads=2, head_dim=8, layers=layers, dtype=dtype, scales_tag=scales_tag
    )


# One root for every test's disk folder, removed when the test process exits.
_DISK_ROOT = tempfile.TemporaryDirectory(prefix="kvtiers-")


def make_tiered(
    life_cycles: Sequence[LifeCycle] = (FullLifeCycle("full"),),
    device_pages: int = 6,
    host_pages: int = 3,
    disk_pages: int = 64,
    disk_dir: str | None = "tmp",
    policy: ReusePolicy | None = None,
    prefetch_num_reqs: int = 0,
    dtype: str = "float32",
    events: list[KVEvent] | None = None,
    scales_tag: str = "",
    clock: Callable[[], float] = time.monotonic,
    host_exclusive: bool = True,
    write_behind: bool = False,
) -> KVCacheManager:
    """A manager with CPU device KV, a host tier and a disk tier in a fresh temp folder, whose
    cache TTLs run on `clock`."""
    names = [lc.name for lc in life_cycles]
    store = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=tuple(life_cycles),
        pool_pages=dict.fromkeys(names, device_pages),
        reuse_policy=policy or AllReusable(),
        checkpoint=False,
    )
    folder = tempfile.mkdtemp(dir=_DISK_ROOT.name) if disk_dir == "tmp" else disk_dir
    tier_config = TierConfig(
        host_pages=dict.fromkeys(names, host_pages),
        disk_pages=dict.fromkeys(names, disk_pages),
        disk_dir=folder,
        disk_prefetch_num_reqs=prefetch_num_reqs,
        host_exclusive=host_exclusive,
        disk_write_behind=write_behind,
    )
    layout = make_layout(life_cycles, dtype, scales_tag)
    tiers = build_tiers(store, tier_config, layout, device=DEVICE)
    listener = events.append if events is not None else (lambda event: None)
    return KVCacheManager(store, listener, tiers, clock)


def block_kv(manager: KVCacheManager, life_cycle: str, block_hash: int) -> torch.Tensor:
    """The page contents a block must have, `[layers, 2, page, heads, dim]`, from its hash."""
    kv = manager.tiers.device_kv
    shape = kv.layout.page_shape(life_cycle)
    generator = torch.Generator().manual_seed(block_hash & 0x7FFF_FFFF)
    return torch.randn(shape, generator=generator).to(device=kv.device, dtype=kv.dtype)


def serve(
    manager: KVCacheManager,
    request_id: str,
    prompt: Sequence[int],
    conversation_id: str | None = None,
) -> int:
    """Admit, "compute" (write block-identified KV), commit and finish; the reused tokens.

    Before writing, checks that every reused page holds its block's exact bytes. Admission may
    reuse less than the match said (a bad disk file), so the rest is allocated after it.
    """
    manager.add_request(request_id, prompt, conversation_id)
    matched = manager.match(request_id).num_reusable_tokens
    reused = manager.admit(request_id, len(prompt) - matched).num_reused_tokens
    manager.allocate(request_id, len(prompt) - reused)
    hashes = block_hashes(prompt, BLOCK)
    kv = manager.tiers.device_kv
    for name, life_cycle in manager.life_cycles.items():
        table = manager.page_table(request_id, name)
        for index, page in enumerate(table[: len(hashes)]):
            if page == NULL_PAGE or not life_cycle.reusable:
                continue
            if index < reused // BLOCK:
                assert same_bits(
                    kv.storage(name)[:, :, page], block_kv(manager, name, hashes[index])
                )
            else:
                kv.storage(name)[:, :, page] = block_kv(manager, name, hashes[index])
    manager.commit(request_id, len(prompt))
    manager.finish_context(request_id)
    manager.finish_request(request_id)
    return reused


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical tensors of one dtype (fp8 has no CPU `equal`)."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.dtype.itemsize]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def prompt_of(seed: int, num_tokens: int = 4 * BLOCK) -> list[int]:
    """Token ids unique to `seed`."""
    return [seed * 1000 + i for i in range(num_tokens)]
