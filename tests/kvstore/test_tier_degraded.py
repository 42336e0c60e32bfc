"""A read-only or full disk degrades to "no disk tier": device and host keep serving."""

import logging
import resource
from contextlib import contextmanager

from kvfleet.kvstore.tiers.disk_files import NoDiskFiles
from kvfleet.kvstore.tiers.disk_tier import WriteBackoff
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


class StepClock:
    """A clock the test moves: the write pause elapses when the test says so, never by sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_disk_that_fills_up_pauses_writes_then_retries(caplog):
    """One refused write (a full volume) must not end the disk tier for the process's life: it
    warns, pauses disk writes while host keeps serving, and writes again once there is room."""
    manager = make_tiered(device_pages=6, host_pages=4)
    clock = StepClock()
    manager.tiers.disk.writes.clock = clock
    serve(manager, "t1", prompt_of(1))
    with caplog.at_level(logging.WARNING), file_size_limit(64):
        for seed in range(2, 5):
            serve(manager, f"t{seed}", prompt_of(seed))
    assert "disk tier write refused" in caplog.text and "then retrying" in caplog.text
    assert manager.tiers.metrics["disk"].errors == 1  # paused: no write tried while full
    assert manager.tiers.disk.index.capacity == {"full": 64}
    assert serve(manager, "t3b", [*prompt_of(3), 5]) == 4 * BLOCK  # host still serves
    written = manager.tiers.metrics["disk"].pages_in
    clock.now += manager.tiers.disk.writes.first_seconds  # the pause is over; room again
    for seed in range(5, 9):
        serve(manager, f"t{seed}", prompt_of(seed))
    assert manager.tiers.metrics["disk"].pages_in > written  # writing again
    assert manager.tiers.metrics["disk"].errors == 1
    assert serve(manager, "t5b", [*prompt_of(5), 5]) == 4 * BLOCK  # back from the disk
    manager.check_integrity()
    manager.tiers.close()


def test_write_pauses_double_up_to_a_cap_and_reset_on_success():
    """If this fails, a failing volume is retried on every eviction (a warning storm) or never
    again."""
    clock = StepClock()
    backoff = WriteBackoff(first_seconds=1.0, max_seconds=4.0, clock=clock)
    assert backoff.ready()
    assert [backoff.failed() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert not backoff.ready()
    clock.now += 4.0
    assert backoff.ready()
    backoff.succeeded()
    assert backoff.failed() == 1.0
