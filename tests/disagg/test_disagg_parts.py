"""Parts of the hand-off without ranks: page bytes, disk files, transport registry, placement."""

from __future__ import annotations

import pytest
import torch
from kvfleet.services.disagg.blocks import NO_HASH, KVBlock, kv_layout, read_pages, write_pages
from kvfleet.services.disagg.disk_handoff import DiskHandoff
from kvfleet.services.disagg.transport_types import FetchRequest, TransportContext, TransportError
from kvfleet.services.disagg.transports import build_transports
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.kv.kv_cache import PagedKVCache
from kvfleet.services.router.admission import (
    GENERATION_ROLES,
    AdmissionConfig,
    AdmissionQueue,
)
from kvfleet.services.router.handoff import generation_request
from kvfleet.services.router.model import PendingRequest, RankInfo, Role
from kvfleet.services.router.store import LocalStore


def _cache(seed: int) -> PagedKVCache:
    cache = PagedKVCache(preset("tiny"), 8, 16)
    generator = torch.Generator().manual_seed(seed)
    for layer in range(cache.config.num_layers):
        for pages in cache.kv(layer):
            pages[1:] = torch.randn(pages[1:].shape, generator=generator)
    return cache


def test_page_bytes_read_on_one_cache_write_identically_into_another():
    """A layout mix-up (layer order, K/V swap) would hand the decoder the wrong KV."""
    source, target = _cache(0), _cache(1)
    for group in source.config.groups:
        write_pages(target, group, [5, 6], read_pages(source, group, [2, 3]))
    for layer in range(source.config.num_layers):
        for src, dst in zip(source.kv(layer), target.kv(layer), strict=True):
            assert torch.equal(dst[5:7], src[2:4])


def test_disk_handoff_returns_full_and_partial_blocks_and_then_drops_the_partial(tmp_path):
    """A partial block left on disk forever, or a full one not found, breaks the fallback."""
    cache = _cache(0)
    disk = DiskHandoff(str(tmp_path), kv_layout(cache))
    data = read_pages(cache, "full", [1, 2])
    blocks = [KVBlock("full", 0, 0xABC, data[0]), KVBlock("full", 1, NO_HASH, data[1])]
    disk.write("req-1", blocks)
    request = FetchRequest("req-1", "", (), {"full": ((0, 0xABC), (1, NO_HASH))}, 1.0)
    assert disk.fetch(request) == blocks
    assert disk.has("full", 0xABC)
    assert disk.fetch(request) == blocks[:1]  # the partial block's file was removed on read


def test_disk_handoff_with_nothing_on_disk_is_a_transport_error(tmp_path):
    """Returning an empty list as success would install a request with no KV at all."""
    disk = DiskHandoff(str(tmp_path), kv_layout(_cache(0)))
    with pytest.raises(TransportError, match="no block of request 'gone'"):
        disk.fetch(FetchRequest("gone", "", (), {"full": ((0, 5),)}, 1.0))


def test_transport_registry_keeps_order_leaves_out_disk_without_a_dir_and_names_unknowns():
    """A typo in handoff_transports silently ignored would leave a rank without its fallback."""
    context = TransportContext(("full", "window"), kv_layout(_cache(0)))
    assert [t.name for t in build_transports(("disk", "grpc"), context)] == ["grpc"]
    with pytest.raises(ValueError, match=r"unknown \['rdma'\]; known: \['disk', 'grpc'\]"):
        build_transports(("grpc", "rdma"), context)


def _rank(rank_id: str, role: Role, slots: int = 1) -> RankInfo:
    return RankInfo(rank_id, f"{rank_id}:1", slots, role)


def test_generation_queue_places_only_on_generation_ranks_and_pins_per_pool():
    """Decoding on a context rank, or one pin shared by both pools, would defeat the split."""
    store = LocalStore()
    for info in (_rank("ctx", Role.CONTEXT), _rank("gen-a", Role.GENERATION),
                 _rank("gen-b", Role.GENERATION)):  # fmt: skip
        store.register_rank(info, 0.0)
    config = AdmissionConfig()
    contexts = AdmissionQueue(store, config, lambda: 0.0)
    generations = AdmissionQueue(store, config, lambda: 0.0, roles=GENERATION_ROLES)
    contexts.enqueue(PendingRequest("r1", "conv", 0.0))
    assert [a.rank.rank_id for a in contexts.run_pass().admitted] == ["ctx"]
    generations.enqueue(PendingRequest("r1@generation", "conv@generation", 0.0))
    placed = generations.run_pass().admitted
    assert [a.rank.role for a in placed] == [Role.GENERATION]
    pins = store.get_pins(["conv", "conv@generation"], 0.0)
    assert pins == {"conv": "ctx", "conv@generation": placed[0].rank.rank_id}
    store.check_integrity()


def test_generation_placement_waits_for_its_pinned_rank_under_strict_affinity():
    """Moving a returning turn to another generation rank resends blocks it already holds."""
    store = LocalStore()
    for info in (_rank("gen-a", Role.GENERATION), _rank("gen-b", Role.GENERATION)):
        store.register_rank(info, 0.0)
    queue = AdmissionQueue(store, AdmissionConfig(), lambda: 0.0, roles=GENERATION_ROLES)
    store.try_admit("gen-a", "other", 1, "conv@generation", 60.0, 0.0)  # pinned and full
    queue.enqueue(PendingRequest("r2@generation", "conv@generation", 0.0))
    result = queue.run_pass()
    assert (result.admitted, result.deferrals) == ([], 1)
    store.release("gen-a", "other")
    assert [a.rank.rank_id for a in queue.run_pass().admitted] == ["gen-a"]
    store.check_integrity()


class _Request:
    """The few GenerateRequest fields the generation placement reads."""

    def HasField(self, name: str) -> bool:
        return False


def test_generation_request_keys_its_reservation_and_pin_apart_from_the_context_one():
    """Sharing the id would let releasing one placement's slot release the other's."""
    pending = generation_request(_Request(), "r9", "conv", lambda: 5.0)
    assert (pending.request_id, pending.conversation_id) == ("r9@generation", "conv@generation")
    assert generation_request(_Request(), "r9", "", lambda: 5.0).conversation_id == ""
