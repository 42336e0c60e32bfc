"""`observe_many` records what as many `observe` calls record (buckets, count, sum)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.core.histogram_counts import observe_many
from kvfleet.services.engine.core.metrics import LATENCY_BUCKETS
from prometheus_client import CollectorRegistry, Histogram

# Bounds themselves and values around them: `observe` counts a value equal to a bound in it.
AMOUNTS = st.one_of(
    st.sampled_from(LATENCY_BUCKETS),
    st.floats(min_value=0.0, max_value=60.0, allow_nan=False),
)


def samples(histogram: Histogram) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in histogram.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(AMOUNTS, st.integers(0, 300)), max_size=8))
def test_counted_observations_equal_one_by_one(observations):
    one_by_one = Histogram("a", "a", registry=CollectorRegistry(), buckets=LATENCY_BUCKETS)
    counted = Histogram("a", "a", registry=CollectorRegistry(), buckets=LATENCY_BUCKETS)
    for amount, count in observations:
        for _ in range(count):
            one_by_one.observe(amount)
        observe_many(counted, amount, count)
    expected, got = samples(one_by_one), samples(counted)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
