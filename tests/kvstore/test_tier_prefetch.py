"""Prefetch: queued requests' disk blocks reach host in the background, before admission."""

import threading

from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.tiers.disk_files import DiskFiles
from kvfleet.kvstore.tiers.prefetch import Prefetcher
from tier_factories import BLOCK, make_tiered, prompt_of, serve


def _on_disk(prefetch_num_reqs):
    """Turns "a" (seed 1) and "b" (seed 2) spilled to disk; host holds 8 blocks."""
    manager = make_tiered(
        device_pages=6, host_pages=8, disk_pages=64, prefetch_num_reqs=prefetch_num_reqs
    )
    for seed in range(1, 7):
        serve(manager, f"t{seed}", prompt_of(seed))
    return manager


def test_a_queued_requests_blocks_are_on_host_before_it_is_admitted():
    """Prefetch must move the first waiting request's disk blocks to host ahead of admission."""
    manager = _on_disk(prefetch_num_reqs=1)
    manager.add_request("a2", [*prompt_of(1), 5])
    manager.add_request("b2", [*prompt_of(2), 5])
    assert manager.match("a2").locations["full"] == ("disk",) * 4
    assert manager.prefetch(["a2", "b2"]) == 4
    assert manager.tiers.wait_prefetch(timeout_s=10)
    assert manager.land_prefetched() == 4
    assert manager.match("a2").locations["full"] == ("host",) * 4
    assert manager.match("b2").locations["full"][:2] == ("disk", "disk")  # beyond the first 1
    manager.finish_request("b2")
    manager.finish_request("a2")
    assert serve(manager, "a3", [*prompt_of(1), 5]) == 4 * BLOCK  # checks the bytes
    assert (manager.tiers.metrics["host"].hits, manager.tiers.metrics["disk"].hits) == (4, 0)
    manager.check_integrity()
    manager.tiers.close()


def test_no_prefetch_when_the_depth_is_zero():
    """`disk_prefetch_num_reqs=0` must queue nothing, so admission reads disk itself."""
    manager = _on_disk(prefetch_num_reqs=0)
    manager.add_request("a2", [*prompt_of(1), 5])
    assert manager.prefetch(["a2"]) == 0
    manager.finish_request("a2")
    manager.check_integrity()
    manager.tiers.close()


class GatedFiles(DiskFiles):
    """Real block files whose reads wait for a gate, so a test can act while a read runs."""

    def __init__(self, root):
        super().__init__(root, {"full": b"full/test"})
        self.gate, self.reading = threading.Event(), threading.Event()

    def check_into(self, life_cycle, block_hash, out, contents=b""):
        self.reading.set()
        assert self.gate.wait(10)
        return super().check_into(life_cycle, block_hash, out, contents)


def test_cancelled_reads_are_discarded(tmp_path):
    """A request that leaves the prefetch window must not land its blocks on host."""
    files = GatedFiles(tmp_path)
    for block_hash in (1, 2):
        files.write("full", block_hash, b"\x07" * 16)
    prefetcher = Prefetcher(files, {"full": 16}, max_queued_blocks=4)
    assert prefetcher.submit(("full", 1)) and prefetcher.submit(("full", 2))
    assert files.reading.wait(10)
    prefetcher.cancel([("full", 1), ("full", 2)])
    files.gate.set()
    assert prefetcher.wait_idle(10)
    assert prefetcher.completed() == []
    prefetcher.close()


def test_the_queue_is_bounded(tmp_path):
    """Past `max_queued_blocks` submissions are refused, not buffered without limit."""
    files = GatedFiles(tmp_path)
    prefetcher = Prefetcher(files, {"full": 16}, max_queued_blocks=1)
    assert prefetcher.submit(("full", 1))
    assert files.reading.wait(10)  # the worker holds block 1; the queue is empty again
    assert prefetcher.submit(("full", 2))
    assert not prefetcher.submit(("full", 3))
    files.gate.set()
    assert prefetcher.wait_idle(10)
    assert [key for key, *_ in prefetcher.completed()] == [("full", 1), ("full", 2)]
    prefetcher.close()


def test_prefetched_hashes_are_the_requests_blocks():
    """The blocks read are exactly the waiting request's disk blocks (by chained hash)."""
    manager = _on_disk(prefetch_num_reqs=1)
    manager.add_request("a2", [*prompt_of(1), 5])
    manager.prefetch(["a2"])
    assert manager.tiers.wait_prefetch(timeout_s=10)
    manager.land_prefetched()
    hashes = block_hashes(prompt_of(1), BLOCK)
    assert set(hashes) <= set(manager.tiers.host.hashes("full"))
    manager.finish_request("a2")
    manager.check_integrity()
    manager.tiers.close()
