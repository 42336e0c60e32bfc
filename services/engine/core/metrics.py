"""Prometheus metrics of one engine rank, in a registry of its own (several ranks per process)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ...disagg.metrics import HandoffMetrics
from ..request.engine_request import EngineLoad, Usage
from .histogram_counts import observe_many
from .tier_metrics import TierMetricsCollector
from .vllm_metrics import VllmMetrics

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TOKEN_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


class EngineMetrics:
    """Per-request TTFT, inter-token latency, cached tokens; KV usage and retained pages."""

    def __init__(self, model_name: str = "kvfleet") -> None:
        """`model_name`: the label of the vLLM-named series (vllm_metrics.py)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "kvfleet_engine_ttft_seconds", "Time to first token per sample", registry=r,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "kvfleet_engine_inter_token_latency_seconds", "Time between a sample's tokens",
            registry=r, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.step_seconds = Histogram(
            "kvfleet_engine_step_seconds",
            "One engine step: with any prefill chunk (prefill) or decodes only (decode)",
            ["kind"], registry=r, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.cached_tokens = Histogram(
            "kvfleet_engine_request_cached_tokens", "Reused prompt tokens per sample",
            registry=r, buckets=TOKEN_BUCKETS,
        )  # fmt: skip
        self.prompt_tokens_total = Counter(
            "kvfleet_engine_prompt_tokens", "Prompt tokens of finished samples", registry=r
        )
        self.cached_tokens_total = Counter(
            "kvfleet_engine_cached_tokens", "Reused prompt tokens of finished samples", registry=r
        )
        self.finished = Counter(
            "kvfleet_engine_samples_finished", "Finished samples by reason", ["reason"], registry=r
        )
        self.preemptions = Counter(
            "kvfleet_engine_preemptions", "Sequences preempted for pages", registry=r
        )
        self.retained_released = Counter(
            "kvfleet_engine_retained_conversations_released",
            "Conversations whose retained turns were handed to the LRU to make room", registry=r,
        )  # fmt: skip
        self.retained_released_early = Counter(
            "kvfleet_engine_retained_conversations_released_in_ttl",
            "Of those, conversations released inside their client's cache TTL (no other room)",
            registry=r,
        )
        # NOTE: the operator's autoscaler reads the two *_ratio names (docs/operator.md).
        self.kv_usage = Gauge(
            "kvfleet_engine_kv_usage_ratio", "Share of KV pages in use, 0..1", registry=r
        )
        self.retained_pages = Gauge(
            "kvfleet_engine_retained_pages", "Pages held by retained conversation turns", registry=r
        )
        self.retained_working_set = Gauge(
            "kvfleet_engine_retained_working_set_ratio",
            "Pages held by retained conversation turns / KV capacity, 0..1", registry=r,
        )  # fmt: skip
        self.drain_flushed_blocks = Counter(
            "kvfleet_engine_drain_flushed_blocks",
            "Retained blocks a draining rank wrote to the shared disk tier", registry=r,
        )  # fmt: skip
        self.running = Gauge("kvfleet_engine_running", "Sequences running", registry=r)
        self.queued = Gauge("kvfleet_engine_queued", "Sequences waiting", registry=r)
        self.handoff = HandoffMetrics(r)
        self.tiers = TierMetricsCollector()  # the core hands over its tiers' counters
        r.register(self.tiers)
        self.vllm = VllmMetrics(r, model_name, LATENCY_BUCKETS)

    def first_token(self, seconds: float) -> None:
        """A sample's time to first token."""
        self.ttft.observe(seconds)
        self.vllm.ttft.observe(seconds)

    def token_gap(self, seconds: float) -> None:
        """The time between two tokens of a sample."""
        self.itl.observe(seconds)
        self.vllm.tpot.observe(seconds)

    def token_gaps(self, counts: Mapping[float, int]) -> None:
        """Many gaps at once (a decode step's), as `{gap: how many samples had it}`."""
        for seconds, count in counts.items():
            observe_many(self.itl, seconds, count)
            observe_many(self.vllm.tpot, seconds, count)

    def sample_finished(self, usage: Usage, reason: str) -> None:
        """Record one finished sample's usage."""
        self.cached_tokens.observe(usage.cached_tokens)
        self.prompt_tokens_total.inc(usage.prompt_tokens)
        self.cached_tokens_total.inc(usage.cached_tokens)
        self.finished.labels(reason).inc()
        self.vllm.finished(usage.prompt_tokens, usage.completion_tokens, reason)

    def observe_step(self, chunks, seconds: float) -> None:
        """Record one step's duration by what it computed."""
        prefill = any(len(chunk.new_tokens) > 1 for chunk in chunks)
        self.step_seconds.labels("prefill" if prefill else "decode").observe(seconds)

    def load(self, load: EngineLoad) -> None:
        """Record the rank's load after a step."""
        self.kv_usage.set(load.kv_usage)
        self.retained_pages.set(load.retained_pages)
        self.retained_working_set.set(load.retained_working_set)
        self.running.set(load.running)
        self.queued.set(load.queued)
        self.vllm.load(load.running, load.queued, load.kv_usage)
