"""Prometheus metrics of one router, in its own registry (several routers may share a process)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .admission import PassResult
from .model import Placement
from .recent_quantile import RecentQuantile


@dataclass
class RouterMetrics:
    """The router's metrics; `registry` is what the /metrics endpoint serves."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # TTFT as clients see it (arrival to first chunk); the operator's autoscaler reads its p90.
    ttft_window: RecentQuantile = field(default_factory=lambda: RecentQuantile(0.9, 60.0))

    def __post_init__(self) -> None:
        r = self.registry
        self._ranks_seen: set[str] = set()
        self.queue_depth = Gauge("kvfleet_router_queue_depth", "Requests waiting", registry=r)
        self.admissions = Counter(
            "kvfleet_router_admissions",
            "Admitted requests by placement",
            ["placement"],
            registry=r,
        )
        self.deferrals = Counter(
            "kvfleet_router_deferrals",
            "Admission passes that deferred a pinned request",
            registry=r,
        )
        # NOTE: the operator's autoscaler reads this name (docs/operator.md), keep it stable.
        self.deferrals_past_bound = Counter(
            "kvfleet_router_deferrals_past_bound",
            "Pinned requests placed elsewhere after the deferral bound (strict fallbacks)",
            registry=r,
        )
        self.kv_moves = Counter(
            "kvfleet_router_kv_moves",
            "Turns placed away from their live home whose new rank was told to pull its KV",
            registry=r,
        )
        self.pinned_hits = Counter(
            "kvfleet_router_pinned_hits", "Requests admitted on their pinned rank", registry=r
        )
        self.rank_free_slots = Gauge(
            "kvfleet_router_rank_free_slots",
            "Free slots per rank at the last pass",
            ["rank"],
            registry=r,
        )
        self.redis_errors = Counter("kvfleet_router_redis_errors", "Failed Redis calls", registry=r)
        self.degraded = Gauge(
            "kvfleet_router_degraded", "1 while Redis is away and local state serves", registry=r
        )
        self.failed = Counter(
            "kvfleet_router_requests_failed",
            "Requests failed, by status code",
            ["code"],
            registry=r,
        )
        self.retries = Counter(
            "kvfleet_router_retries", "Requests re-queued after their rank failed", registry=r
        )
        self.requeued_full = Counter(
            "kvfleet_router_requeued_full",
            "Requests queued again after their rank answered RESOURCE_EXHAUSTED",
            registry=r,
        )
        self.ranks_removed = Counter(
            "kvfleet_router_ranks_removed", "Ranks removed (silent or failed)", registry=r
        )
        self.admission_wait = Histogram(
            "kvfleet_router_admission_wait_seconds",
            "Time from arrival to admission",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.ttft = Histogram(
            "kvfleet_router_ttft_seconds",
            "Time from arrival to the first chunk streamed back",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.inter_chunk = Histogram(
            "kvfleet_router_inter_chunk_seconds",
            "Time between a request's streamed chunks as the router passes them on (against the "
            "engine's inter-token latency it shows where a stream's time goes)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.ttft_p90 = Gauge(
            "kvfleet_router_ttft_p90_seconds",
            "p90 of the time to first chunk over the last minute (0 without traffic)",
            registry=r,
        )
        self.ttft_p90.set_function(self.ttft_window.value)

    def observe_ttft(self, seconds: float) -> None:
        """Record one request's time from arrival to its first streamed chunk."""
        self.ttft.observe(seconds)
        self.ttft_window.observe(seconds)

    def record_pass(self, result: PassResult, queue_depth: int) -> None:
        """Count what one admission pass did."""
        for placement in Placement:
            count = result.count(placement)
            if count:
                self.admissions.labels(placement.value).inc(count)
        self.pinned_hits.inc(result.count(Placement.PINNED))
        self.deferrals_past_bound.inc(result.count(Placement.FALLBACK))
        self.deferrals.inc(result.deferrals)
        self.queue_depth.set(queue_depth)

        self._record_free_slots(result.free_slots)

    def _record_free_slots(self, free_slots: dict[str, int]) -> None:
        """Publish free slots per rank, dropping ranks that left."""
        for gone in self._ranks_seen - free_slots.keys():
            self.rank_free_slots.remove(gone)
        self._ranks_seen = set(free_slots)
        for rank_id, free in free_slots.items():
            self.rank_free_slots.labels(rank_id).set(free)
