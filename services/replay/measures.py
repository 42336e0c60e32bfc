"""The measures of a replay, under the names every part of kvfleet uses.

- prefix_reuse: reused prompt tokens / all prompt tokens (token-weighted).
- later_turns: requests that are a conversation's second or later turn;
  later_turns_no_reuse: the share of those whose reuse is under 2 % of their prompt.
- oracle_reuse: prefix reuse with an infinite cache and perfect routing (given by the caller).
- Throughput over duration_s (first arrival to last finish); TTFT and inter-token latency
  percentiles use linear interpolation between samples, and are None without samples.
Only successful records count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from .oracle import NO_REUSE_FRACTION
from .records import RequestRecord

# The `--json` fields, in the order they are written (then `config`).
MEASURE_FIELDS: tuple[str, ...] = (
    "requests",
    "prompt_tokens",
    "reused_tokens",
    "prefix_reuse",
    "oracle_reuse",
    "later_turns",
    "later_turns_no_reuse",
    "req_per_s",
    "output_tok_per_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "itl_p90_s",
    "duration_s",
)


@dataclass(frozen=True)
class ReplayMeasures:
    """The measures of one replay arm, as written by `--json`."""

    requests: int
    prompt_tokens: int
    reused_tokens: int
    prefix_reuse: float
    oracle_reuse: float
    later_turns: int
    later_turns_no_reuse: float
    req_per_s: float
    output_tok_per_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    itl_p90_s: float | None
    duration_s: float
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The measure fields and `config`, nothing else."""
        return asdict(self)


def _percentile(samples: Sequence[float], percent: float) -> float | None:
    if not samples:
        return None
    return float(np.percentile(np.asarray(samples, dtype=np.float64), percent))


def _fraction(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def is_no_reuse(record: RequestRecord) -> bool:
    """True when a request reused under 2 % of its prompt."""
    return record.reused_tokens < NO_REUSE_FRACTION * record.prompt_tokens


def compute_measures(
    records: Iterable[RequestRecord], oracle_reuse: float, config: dict[str, Any] | None = None
) -> ReplayMeasures:
    """Summarise the successful records of one run."""
    if not 0.0 <= oracle_reuse <= 1.0:
        raise ValueError(f"oracle_reuse={oracle_reuse} must be in [0, 1]")
    done = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    reused = sum(r.reused_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    later = [r for r in done if r.turn_index >= 1]
    duration = max(r.finish_s for r in done) - min(r.arrival_s for r in done) if done else 0.0
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    gaps = [
        later_time - earlier_time
        for r in done
        for earlier_time, later_time in pairwise(r.token_times_s)
    ]
    return ReplayMeasures(
        requests=len(done),
        prompt_tokens=prompt,
        reused_tokens=reused,
        prefix_reuse=_fraction(reused, prompt),
        oracle_reuse=oracle_reuse,
        later_turns=len(later),
        later_turns_no_reuse=_fraction(sum(1 for r in later if is_no_reuse(r)), len(later)),
        req_per_s=_fraction(len(done), duration),
        output_tok_per_s=_fraction(output, duration),
        ttft_p50_s=_percentile(ttfts, 50),
        ttft_p90_s=_percentile(ttfts, 90),
        itl_p90_s=_percentile(gaps, 90),
        duration_s=duration,
        config=dict(config or {}),
    )


def reuse_by_window(records: Iterable[RequestRecord], window_s: float) -> list[tuple[float, float]]:
    """(window start, prefix reuse) per window of arrival time, from the first arrival."""
    if window_s <= 0:
        raise ValueError(f"window_s={window_s} must be > 0")
    done = [r for r in records if r.ok]
    if not done:
        return []
    start = min(r.arrival_s for r in done)
    totals: dict[int, list[int]] = {}
    for r in done:
        bucket = totals.setdefault(int((r.arrival_s - start) // window_s), [0, 0])
        bucket[0] += r.reused_tokens
        bucket[1] += r.prompt_tokens
    return [
        (index * window_s, _fraction(reused, prompt))
        for index, (reused, prompt) in sorted(totals.items())
    ]
