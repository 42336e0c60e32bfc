"""Hand-off metrics of one engine rank, registered in the rank's own registry: a parked
request's KV (disaggregation) and a moved turn's prefix (`prefix_pull.py`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class HandoffMetrics:
    """Bytes and blocks moved, blocks skipped because the receiver held them, time, failures."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.bytes = Counter(
            "kvfleet_engine_handoff_bytes", "KV bytes handed off", ["direction", "transport"],
            registry=r,
        )  # fmt: skip
        self.blocks = Counter(
            "kvfleet_engine_handoff_blocks", "KV blocks handed off", ["direction", "transport"],
            registry=r,
        )  # fmt: skip
        self.blocks_skipped = Counter(
            "kvfleet_engine_handoff_blocks_skipped",
            "Blocks not moved because the receiving rank already held them", registry=r,
        )  # fmt: skip
        self.bytes_skipped = Counter(
            "kvfleet_engine_handoff_bytes_skipped",
            "KV bytes not moved because the receiving rank already held their blocks", registry=r,
        )  # fmt: skip
        self.seconds = Histogram(
            "kvfleet_engine_handoff_seconds", "Time to fetch and install one request's KV",
            ["transport"], registry=r, buckets=SECONDS_BUCKETS,
        )  # fmt: skip
        self.failures = Counter(
            "kvfleet_engine_handoff_failures", "Hand-off attempts that failed, by transport",
            ["transport"], registry=r,
        )  # fmt: skip
        self.expired = Counter(
            "kvfleet_engine_handoff_expired",
            "Parked requests released because nobody pulled them in time", registry=r,
        )  # fmt: skip
        self.parked = Counter(
            "kvfleet_engine_handoff_parked", "Requests parked after prefill for a hand-off",
            registry=r,
        )  # fmt: skip
        self.moves = MoveMetrics(r)


# What became of one moved turn's pull (`prefix_pull.py`).
PULLED, NOTHING, FAILED, MISSING, NO_ROOM = "pulled", "nothing", "failed", "missing", "no_room"


class MoveMetrics:
    """Turns placed away from their home that pulled its prefix here, and what moved."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.turns = Counter(
            "kvfleet_engine_moved_turns",
            "Moved turns by what their pull did: pulled, nothing (the home had no block past "
            "this rank's), failed (home unreachable), missing (blocks a resume needs did not "
            "come), no_room", ["outcome"], registry=r,
        )  # fmt: skip
        self.blocks = Counter(
            "kvfleet_engine_moved_blocks", "Blocks of moved turns' prefixes, sent or received",
            ["direction"], registry=r,
        )  # fmt: skip
        self.bytes = Counter(
            "kvfleet_engine_moved_bytes", "KV bytes of moved turns' prefixes, sent or received",
            ["direction"], registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "kvfleet_engine_moved_tokens",
            "Prompt tokens moved turns found pulled here instead of recomputing", registry=r,
        )  # fmt: skip
        self.seconds = Histogram(
            "kvfleet_engine_moved_pull_seconds", "Time to pull and install a moved turn's prefix",
            registry=r, buckets=SECONDS_BUCKETS,
        )  # fmt: skip
