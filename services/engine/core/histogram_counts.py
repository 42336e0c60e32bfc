"""Many equal observations of a Prometheus histogram at once.

A decode step hands out one token per sequence, and every sequence of a steady batch got its
last token in the same step before: their gaps are one value. Observing it once per sequence
costs two locked increments per token (bucket and sum); this records them as one of each.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Histogram


def observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """What `histogram.observe(amount)` called `count` times records (the sum up to rounding).

    NOTE: prometheus_client has no counted observe; this reaches its bucket and sum values,
    as `observe` itself does (`tests/engine/test_histogram_counts.py` holds it to that).
    """
    if count <= 0:
        return
    histogram._raise_if_not_observable()
    histogram._sum.inc(amount * count)
    # `observe` counts the first bucket whose upper bound is >= amount.
    index = bisect_left(histogram._upper_bounds, amount)
    if index < len(histogram._buckets):
        histogram._buckets[index].inc(count)
