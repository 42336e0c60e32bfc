"""The router metrics the operator's autoscaler reads: queue depth, deferrals past the bound,
TTFT p90 over the last minute (names are a contract: docs/operator.md)."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from kvfleet.operator.metrics import DEFERRALS, QUEUE_DEPTH, TTFT_P90, metric_sums
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.router.admission import PassResult
from kvfleet.services.router.metrics import RouterMetrics
from kvfleet.services.router.model import Admission, PendingRequest, Placement, RankInfo
from kvfleet.services.router.recent_quantile import RecentQuantile
from kvfleet.services.router.server import RouterConfig, create_server
from prometheus_client import generate_latest
from router_fake_engine import FakeEngine, wait_until


def test_quantile_is_the_nearest_rank_value(clock):
    """The p90 gauge would be off by one rank (too low under tail latency) with other indexing."""
    window = RecentQuantile(0.9, 60, clock=clock)
    for value in range(1, 11):
        window.observe(float(value))
    assert window.value() == 9.0
    window.observe(11.0)
    assert window.value() == 10.0  # ceil(0.9 * 11) = 10th of 11


def test_values_leave_the_window_after_a_minute(clock):
    """A slow minute long past would keep the fleet scaled out if old values stayed."""
    window = RecentQuantile(0.9, 60, clock=clock)
    window.observe(30.0)
    clock.advance(59)
    window.observe(1.0)
    assert window.value() == 30.0
    clock.advance(2)
    assert window.value() == 1.0
    clock.advance(60)
    assert window.value() == 0.0  # no traffic: no latency pressure


def test_window_keeps_at_most_max_values(clock):
    """Memory would grow with traffic if the window were unbounded."""
    window = RecentQuantile(1.0, 60, clock=clock, max_values=3)
    for value in (100.0, 1.0, 2.0, 3.0):
        window.observe(value)
    assert window.value() == 3.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantile": 0.0}, "quantile: 0.0"),
        ({"quantile": 0.9, "window_seconds": 0}, "window_seconds: 0"),
        ({"quantile": 0.9, "max_values": 0}, "max_values: 0"),
    ],
)
def test_bad_window_settings_are_refused(kwargs, message):
    """A zero window or quantile would silently report 0 forever."""
    with pytest.raises(ValueError, match=message):
        RecentQuantile(**kwargs)


def test_fallbacks_count_as_deferrals_past_the_bound():
    """The autoscaler's deferral signal would stay flat if fallbacks were not counted by name."""
    metrics = RouterMetrics()
    rank = RankInfo("a", "a:1", 4)
    result = PassResult(
        admitted=[
            Admission(PendingRequest("x", "c1", 0.0), rank, Placement.FALLBACK),
            Admission(PendingRequest("y", "c2", 0.0), rank, Placement.FALLBACK),
            Admission(PendingRequest("z", "c3", 0.0), rank, Placement.AWAY),
        ],
        free_slots={"a": 1},
    )
    metrics.record_pass(result, queue_depth=5)
    sums = metric_sums(generate_latest(metrics.registry).decode())
    assert (sums[DEFERRALS], sums[QUEUE_DEPTH], sums[TTFT_P90]) == (2.0, 5.0, 0.0)


def test_served_request_sets_ttft_p90_on_the_metrics_page():
    """The autoscaler would read no TTFT if the router did not time its first chunk."""
    server, port = create_server("127.0.0.1:0", RouterConfig())
    engine = FakeEngine("r0", 2, delay=0.2)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        engine.join(f"127.0.0.1:{port}")
        wait_until(lambda: len(server.runtime.ranks()) == 1)
        turn = router_pb2.GenerateRequest(
            conversation_id="conv-t",
            prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
            max_tokens=3,
        )
        assert len(list(router_pb2_grpc.RouterStub(channel).Generate(turn, timeout=10))) == 3
        url = f"http://127.0.0.1:{server.serve_metrics(0, '127.0.0.1')}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        # The first chunk comes after one engine delay (0.2 s); the whole stream takes three.
        assert 0.2 <= metric_sums(text)[TTFT_P90] < 0.6
        assert "kvfleet_router_ttft_seconds_count 1.0" in text
        # Two gaps between the three chunks, each about one engine delay.
        assert "kvfleet_router_inter_chunk_seconds_count 2.0" in text
        gaps = float(text.split("kvfleet_router_inter_chunk_seconds_sum ", 1)[1].split()[0])
        assert 0.3 <= gaps < 1.0
    finally:
        channel.close()
        engine.kill()
        server.runtime.store.check_integrity()
        server.stop(0)
