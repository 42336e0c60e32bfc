"""The kvstore tiers' counters as Prometheus counters, one series per tier (device, host, disk).

The tiers keep plain `TierMetrics` counters on the core thread; this collector reads them at
scrape time, so the hot path pays nothing. A scrape may see one step's counters half updated;
every series only grows, so rates stay right.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ....kvstore.tiers.metrics import TierMetrics

PREFIX = "kvfleet_engine_kv_tier"
# (metric suffix, help, TierMetrics field) of the counters labelled by tier alone.
PER_TIER = (
    ("hits", "Pages of admitted prefixes served from the tier", "hits"),
    ("misses", "Pages looked for in the tier and not there", "misses"),
    ("copy_seconds", "Seconds spent copying pages into the tier", "copy_seconds"),
    ("evictions", "Pages evicted from the tier", "evictions"),
    ("errors", "Refused writes (disk: writes pause, then are retried)", "errors"),
    (
        "refused_files",
        "Non-regular files (FIFO, device, link) where a block file should be: misses",
        "refused_files",
    ),
)
# (metric suffix, help, field moved in, field moved out) of the counters by tier and direction.
PER_DIRECTION = (
    ("pages", "Pages moved into (in) or out of (out) the tier", "pages_in", "pages_out"),
    ("bytes", "KV bytes moved into (in) or out of (out) the tier", "bytes_in", "bytes_out"),
)


class TierMetricsCollector(Collector):
    """Counters `kvfleet_engine_kv_tier_*_total{tier[,direction]}` read from `watch`ed tiers."""

    def __init__(self) -> None:
        self._source: Mapping[str, TierMetrics] = {}

    def watch(self, tier_metrics: Mapping[str, TierMetrics]) -> None:
        """Export these counters from now on (a rank's core hands over its tiers' metrics)."""
        self._source = tier_metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One family per counter, one sample per tier (and direction)."""
        source = dict(self._source)
        for suffix, help_text, field in PER_TIER:
            family = CounterMetricFamily(f"{PREFIX}_{suffix}", help_text, labels=["tier"])
            for tier, metrics in source.items():
                family.add_metric([tier], getattr(metrics, field))
            yield family
        for suffix, help_text, field_in, field_out in PER_DIRECTION:
            family = CounterMetricFamily(
                f"{PREFIX}_{suffix}", help_text, labels=["tier", "direction"]
            )
            for tier, metrics in source.items():
                family.add_metric([tier, "in"], getattr(metrics, field_in))
                family.add_metric([tier, "out"], getattr(metrics, field_out))
            yield family
