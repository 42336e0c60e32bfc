"""Byte-less ranks (the engine's `sim` backend) share a disk folder through marker files.

Each manager has byte-less tiers (no layout) over one folder: 16 device pages, no host tier,
64 disk pages, full attention, per_conversation(2). A turn of 4 blocks retains them; a drain
flush writes 4 marker files (header and contents, no payload) that another manager finds.
"""

from __future__ import annotations

import os

from kv_factories import run_turn, tokens
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.tiers.build import TierConfig, build_tiers
from kvfleet.kvstore.tiers.disk_files import MarkerFiles
from kvfleet.kvstore.tiers.metrics import DISK

BLOCK = 4
PROMPT = tokens(1, 4 * BLOCK)


def _byteless(folder: str | None) -> KVCacheManager:
    store = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": 16},
        reuse_policy=PerConversation(max_num_turns=2),
        checkpoint=False,
    )
    tiers = build_tiers(store, TierConfig(disk_pages={"full": 64}, disk_dir=folder))
    return KVCacheManager(store, tiers=tiers)


def _reused(manager: KVCacheManager, request_id: str, prompt: list[int]) -> int:
    return run_turn(manager, request_id, prompt, "a").num_reusable_tokens


def test_a_flush_reaches_another_byteless_rank_on_the_same_folder(tmp_path):
    """Without marker files a sim rank's disk is its own: a drained conversation recomputes."""
    draining, other = _byteless(str(tmp_path)), _byteless(str(tmp_path))
    _reused(draining, "a1", PROMPT)
    assert draining.flush_retained_to_disk() == 4
    files = list((tmp_path / "byteless" / "full").rglob("*.kvb"))
    assert len(files) == 4
    assert {os.path.getsize(path) for path in files} == {os.path.getsize(files[0])}  # no payload
    assert _reused(other, "a2", PROMPT + tokens(2, BLOCK)) == 4 * BLOCK
    assert other.tiers.metrics[DISK].hits == 4
    for manager in (draining, other):
        manager.check_integrity()


def test_without_a_folder_the_byteless_disk_is_the_ranks_own(tmp_path):
    """The simulator's tiers (no folder) keep no files and find none."""
    draining, other = _byteless(None), _byteless(str(tmp_path))
    _reused(draining, "a1", PROMPT)
    assert draining.flush_retained_to_disk() == 4
    assert not isinstance(draining.tiers.disk.files, MarkerFiles)
    assert _reused(other, "a2", PROMPT + tokens(2, BLOCK)) == 0


def test_a_marker_of_other_contents_is_a_miss(tmp_path):
    """A block id collision (or a foreign file) must cost a recompute, never a false match."""
    draining = _byteless(str(tmp_path))
    _reused(draining, "a1", PROMPT)
    draining.flush_retained_to_disk()
    files = draining.tiers.disk.files
    block_hash = draining.tiers.disk.index.hashes("full")[0]
    files.write("full", block_hash, None, b"other contents")
    assert files.check_into("full", block_hash, None, b"the expected contents") is not None
