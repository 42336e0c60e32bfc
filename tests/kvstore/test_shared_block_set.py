"""The simulator's shared disk volume (`SharedBlockSet`) behind two ranks' disk tiers: what one
rank writes the other finds, and what one rank's index evicts is gone for both, as with the
block files of one folder."""

from __future__ import annotations

from kvfleet.kvstore.tiers.disk_files import SharedBlockSet
from kvfleet.kvstore.tiers.disk_tier import DiskTier
from kvfleet.kvstore.tiers.metrics import TierMetrics
from kvfleet.kvstore.tiers.tier_index import TierIndex


def rank_disk(volume: SharedBlockSet, pages: int = 2) -> DiskTier:
    return DiskTier(TierIndex("disk", {"full": pages}), volume, TierMetrics())


def test_a_block_one_rank_wrote_is_read_by_another() -> None:
    volume = SharedBlockSet()
    writer, reader = rank_disk(volume), rank_disk(volume)
    assert writer.store("full", 11, lambda: None)
    assert reader.has("full", 11) and reader.read("full", 11, None)
    assert reader.index.lookup("full", 11) is not None  # adopted into the reader's index
    assert not reader.has("full", 12)


def test_a_block_evicted_by_its_writers_index_is_gone_for_every_rank() -> None:
    """If this fails, the simulated volume keeps blocks no engine rank could read (their file
    was deleted when the writer's index let them go), and predicts reuse the fleet loses."""
    volume = SharedBlockSet()
    writer, reader = rank_disk(volume), rank_disk(volume)
    writer.store("full", 11, lambda: None)
    reader.read("full", 11, None)
    reader.index.unpin_all()  # the onboarding ended
    for block_hash in (12, 13):  # the writer's two pages: block 11 leaves its index
        writer.store("full", block_hash, lambda: None)
    assert not volume.contains("full", 11) and volume.blocks == 2
    assert reader.has("full", 11)  # still in the reader's index ...
    assert not reader.read("full", 11, None)  # ... but its read misses, as a deleted file's
    assert reader.metrics.misses == 1 and not reader.has("full", 11)
