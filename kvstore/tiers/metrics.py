"""Plain per-tier counters; the engine exports them to Prometheus, the simulator reads them."""

from __future__ import annotations

from dataclasses import dataclass

DEVICE, HOST, DISK = "device", "host", "disk"
TIER_NAMES = (DEVICE, HOST, DISK)


@dataclass
class TierMetrics:
    """Counters of one tier; `pages_in`/`bytes_in` are what arrived in it, `*_out` what left.

    hits: blocks of admitted prefixes served from this tier. misses: blocks those prefixes could
    have reused (up to the match cap) that this tier did not have.
    """

    hits: int = 0
    misses: int = 0
    pages_in: int = 0
    pages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    copy_seconds: float = 0.0
    evictions: int = 0
    errors: int = 0
    refused_files: int = 0  # disk: a FIFO, device or link where a block file should be


def new_tier_metrics() -> dict[str, TierMetrics]:
    """One zeroed TierMetrics per tier name."""
    return {name: TierMetrics() for name in TIER_NAMES}
