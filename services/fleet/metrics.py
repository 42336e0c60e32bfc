"""One /metrics page for a whole embedded fleet: the router's metrics and every rank's.

Each rank keeps its own registry (several ranks share the process), so the same metric names
appear once per rank; this collector merges them into one family per name with a `rank`
label, which is what a Prometheus scrape of a real fleet's pods would show side by side.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class FleetMetrics(Collector):
    """The router's registry as it is, the ranks' registries merged with a `rank` label."""

    def __init__(self, router: CollectorRegistry, ranks: Mapping[str, CollectorRegistry]) -> None:
        self.router = router
        self.ranks = dict(ranks)

    def collect(self) -> Iterator[Metric]:
        yield from self.router.collect()
        yield from merge_by_rank(
            (rank, registry.collect()) for rank, registry in self.ranks.items()
        )


def merge_by_rank(per_rank: Iterable[tuple[str, Iterable[Metric]]]) -> list[Metric]:
    """One family per metric name, each sample labelled with the rank it came from."""
    merged: dict[str, Metric] = {}
    for rank, families in per_rank:
        for family in families:
            target = merged.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            for sample in family.samples:
                target.samples.append(sample._replace(labels={**sample.labels, "rank": rank}))
    return list(merged.values())


def serve_fleet_metrics(collector: FleetMetrics, host: str, port: int):
    """Serve `collector` at http://HOST:PORT/metrics; returns the HTTP server (port 0: any)."""
    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, host, registry=registry)
    return server
