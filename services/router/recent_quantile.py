"""A quantile over the last minute of observations (the router's TTFT p90 gauge).

A Prometheus histogram gives quantiles only through a query over buckets; the operator's
autoscaler reads a plain gauge, so the router keeps the recent values and computes the
quantile when the gauge is scraped.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

# Bounds memory under heavy traffic: past this many values in the window, the oldest go first.
MAX_VALUES = 50_000


class RecentQuantile:
    """The `quantile` of values observed in the last `window_seconds` (0.0 when there are none).

    Thread-safe: gRPC handler threads observe, the metrics server thread reads.
    """

    def __init__(
        self,
        quantile: float,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_values: int = MAX_VALUES,
    ) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile: {quantile} not in (0, 1]")
        if window_seconds <= 0:
            raise ValueError(f"window_seconds: {window_seconds} <= 0")
        if max_values < 1:
            raise ValueError(f"max_values: {max_values} < 1")
        self.quantile = quantile
        self.window_seconds = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._values: deque[tuple[float, float]] = deque(maxlen=max_values)  # (at, value)

    def observe(self, value: float) -> None:
        """Record one value now."""
        with self._lock:
            self._values.append((self._clock(), value))

    def value(self) -> float:
        """The quantile of the values still in the window (nearest rank); 0.0 when empty."""
        with self._lock:
            oldest = self._clock() - self.window_seconds
            while self._values and self._values[0][0] < oldest:
                self._values.popleft()
            values = sorted(value for _, value in self._values)
        if not values:
            return 0.0
        return values[math.ceil(self.quantile * len(values)) - 1]
