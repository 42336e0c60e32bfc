"""A read-only or full disk degrades to "no disk tier": device and host keep serving."""

import logging
import resource
from contextlib import contextmanager

from kvfleet.kvstore.tiers.disk_files import NoDiskFiles
from tier_factories import BLOCK, make_tiered, prompt_of, serve

READ_ONLY_DIR = "/proc/kvfleet-disk-tier"  # procfs refuses new entries, even to root


@contextmanager
def file_size_limit(num_bytes):
    """Writes past `num_bytes` fail with EFBIG (Python ignores SIGXFSZ), like a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_read_only_volume_starts_with_no_disk_tier(caplog):
    """An unwritable disk folder must warn and leave device + host serving, never crash."""
    with caplog.at_level(logging.WARNING):
        manager = make_tiered(device_pages=6, host_pages=8, disk_dir=READ_ONLY_DIR)
    assert "no disk tier" in caplog.text
    assert isinstance(manager.tiers.disk.files, NoDiskFiles)
    for seed in range(1, 5):
        serve(manager, f"t{seed}", prompt_of(seed))
    assert serve(manager, "t3b", [*prompt_of(3), 5]) == 4 * BLOCK  # from host, bytes checked
    assert serve(manager, "t1b", [*prompt_of(1), 5]) == 0  # beyond host: recomputed
    manager.check_integrity()
    manager.tiers.close()


def test_a_disk_that_fills_up_turns_the_disk_tier_off(caplog):
    """A failed block write must warn once, drop the disk tier and keep serving from host."""
    manager = make_tiered(device_pages=6, host_pages=4)
    serve(manager, "t1", prompt_of(1))
    with caplog.at_level(logging.WARNING), file_size_limit(64):
        for seed in range(2, 5):
            serve(manager, f"t{seed}", prompt_of(seed))
    assert "disk tier unusable" in caplog.text
    assert manager.tiers.metrics["disk"].errors == 1
    assert isinstance(manager.tiers.disk.files, NoDiskFiles)
    assert manager.tiers.disk.index.capacity == {"full": 0}
    assert serve(manager, "t3b", [*prompt_of(3), 5]) == 4 * BLOCK  # host still serves
    assert serve(manager, "t5", prompt_of(5)) == 0
    manager.check_integrity()
    manager.tiers.close()
