"""Read the fleet's load signals from the router and engine pods' Prometheus endpoints.

Metric names (the router and engines expose these; docs/operator.md is their contract):
router: kvfleet_router_queue_depth (gauge), kvfleet_router_deferrals_past_bound_total
(counter), kvfleet_router_ttft_p90_seconds (gauge); engine: kvfleet_engine_kv_usage_ratio and
kvfleet_engine_retained_working_set_ratio (gauges, 0..1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .autoscale import Sample
from .children import PODS
from .kube import KubeApi
from .names import COMPONENT_LABEL, FLEET_LABEL, FleetRef
from .spec import FleetSpec

QUEUE_DEPTH = "kvfleet_router_queue_depth"
DEFERRALS = "kvfleet_router_deferrals_past_bound"  # the parser drops the counter's `_total`
TTFT_P90 = "kvfleet_router_ttft_p90_seconds"
KV_USAGE = "kvfleet_engine_kv_usage_ratio"
RETAINED = "kvfleet_engine_retained_working_set_ratio"
SCRAPE_TIMEOUT_SECONDS = 2.0

Scrape = Callable[[str], str]


def http_scrape(url: str) -> str:
    """GET a /metrics page."""
    response = httpx.get(url, timeout=SCRAPE_TIMEOUT_SECONDS)
    response.raise_for_status()
    return response.text


def metric_sums(text: str) -> dict[str, float]:
    """Sum of every metric's samples in an exposition page, by family name."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                sums[family.name] = sums.get(family.name, 0.0) + sample.value
    return sums


@dataclass
class FleetMetricsReader:
    """Scrapes one fleet into a Sample per pool; keeps the last counter value for rates."""

    scrape: Scrape = http_scrape
    _last_deferrals: tuple[float, float] | None = field(default=None, init=False)

    def _pages(
        self, kube: KubeApi, fleet: FleetRef, component: str, ports: list[int]
    ) -> list[dict[str, float]]:
        """One page per pod and port (an engine pod serves one per rank)."""
        pods = kube.list(
            PODS, fleet.namespace, {FLEET_LABEL: fleet.name[:63], COMPONENT_LABEL: component}
        )
        pages = []
        for pod in pods:
            ip = pod.get("status", {}).get("podIP")
            if not ip:
                continue
            for port in ports:
                try:
                    pages.append(metric_sums(self.scrape(f"http://{ip}:{port}/metrics")))
                except (httpx.HTTPError, ValueError):
                    continue  # a pod that is starting or leaving has no say this round
        return pages

    def _deferral_rate(self, total: float, now: float) -> float:
        last, self._last_deferrals = self._last_deferrals, (total, now)
        if last is None or now <= last[1] or total < last[0]:
            return 0.0
        return (total - last[0]) / (now - last[1])

    def read(
        self, kube: KubeApi, fleet: FleetRef, spec: FleetSpec, replicas: dict[str, int], now: float
    ) -> dict[str, Sample]:
        """One Sample per enabled pool; empty when no router answered (no data is not low load)."""
        routers = self._pages(kube, fleet, "router", [spec.ports.router_metrics])
        if not routers:
            return {}
        queue = sum(page.get(QUEUE_DEPTH, 0.0) for page in routers)
        rate = self._deferral_rate(sum(page.get(DEFERRALS, 0.0) for page in routers), now)
        ttft = max(page.get(TTFT_P90, 0.0) for page in routers)
        samples = {}
        for name in spec.enabled_pools():
            per_pod = spec.pool(name).ranks_per_pod
            ports = [spec.ports.engine_metrics + index for index in range(per_pod)]
            engines = self._pages(kube, fleet, f"engine-{name}", ports)
            # Every rank of every pod takes from the queue: the depth is per rank, not per pod.
            ranks = replicas[name] * per_pod
            samples[name] = Sample(
                at=now,
                queue_depth_per_rank=queue / ranks if ranks else float("inf") if queue else 0.0,
                deferrals_per_second=rate,
                ttft_p90_seconds=ttft,
                kv_usage=_mean(page.get(KV_USAGE, 0.0) for page in engines),
                retained_working_set=_mean(page.get(RETAINED, 0.0) for page in engines),
            )
        return samples


def _mean(values) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0
