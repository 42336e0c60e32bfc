"""Measures: the exact `--json` fields, computed from per-request records."""

from __future__ import annotations

import pytest
from kvfleet.services.replay.measures import MEASURE_FIELDS, compute_measures, reuse_by_window
from kvfleet.services.replay.records import RequestRecord


def _record(
    turn: int,
    prompt: int,
    reused: int,
    arrival: float,
    tokens: tuple[float, ...],
    conversation: str = "c",
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        conversation_id=conversation,
        turn_index=turn,
        prompt_tokens=prompt,
        reused_tokens=reused,
        output_tokens=len(tokens),
        arrival_s=arrival,
        first_token_s=tokens[0] if tokens else None,
        token_times_s=tokens,
        finish_s=tokens[-1] if tokens else arrival,
        error=error,
    )


RECORDS = [
    _record(0, 1000, 0, 0.0, (0.5, 0.6, 0.8)),  # ttft 0.5, gaps 0.1 0.2
    _record(1, 2000, 1990, 1.0, (1.25, 1.5)),  # ttft 0.25, gap 0.25
    _record(2, 1000, 10, 2.0, (3.0,)),  # ttft 1.0; under 2 %
    _record(0, 1000, 1000, 2.5, (2.75, 4.0), conversation="d"),  # ttft 0.25, gap 1.25
    _record(1, 500, 0, 3.0, (), conversation="d", error="HTTP 500"),  # failed: not counted
]


def test_json_has_exactly_the_issue_fields() -> None:
    """If this fails, bars and CI that read --json find missing or unexpected fields."""
    payload = compute_measures(RECORDS, 0.9, {"seed": 1}).to_json()
    assert list(payload) == [*MEASURE_FIELDS, "config"]
    assert payload["config"] == {"seed": 1}


def test_values_from_records() -> None:
    """If this fails, a measure disagrees with its definition in DESIGN.md."""
    m = compute_measures(RECORDS, 0.9)
    assert (m.requests, m.prompt_tokens, m.reused_tokens) == (4, 5000, 3000)
    assert m.prefix_reuse == 0.6
    assert m.oracle_reuse == 0.9
    assert (m.later_turns, m.later_turns_no_reuse) == (2, 0.5)
    assert m.duration_s == 4.0
    assert (m.req_per_s, m.output_tok_per_s) == (1.0, 2.0)
    assert m.ttft_p50_s == pytest.approx(0.375)
    assert m.ttft_p90_s == pytest.approx(0.85)


def test_itl_p90_over_all_gaps() -> None:
    """If this fails, inter-token latency is not taken over every neighbouring chunk pair."""
    # Gaps: 0.1, 0.2, 0.25, 1.25 -> p90 by linear interpolation = 0.25 + 0.7 * 1.0.
    assert compute_measures(RECORDS, 0.9).itl_p90_s == pytest.approx(0.95)


def test_no_samples_give_none_latencies() -> None:
    """If this fails, a run without tokens reports invented latencies."""
    m = compute_measures([_record(0, 100, 0, 0.0, ())], 0.0)
    assert (m.ttft_p50_s, m.ttft_p90_s, m.itl_p90_s) == (None, None, None)
    assert (m.requests, m.duration_s, m.req_per_s) == (1, 0.0, 0.0)


def test_empty_run_is_all_zero() -> None:
    """If this fails, a run whose every request failed crashes instead of reporting zeros."""
    m = compute_measures([], 0.0)
    assert (m.requests, m.prefix_reuse, m.later_turns_no_reuse, m.duration_s) == (0, 0.0, 0.0, 0.0)


def test_rejects_oracle_outside_unit_interval() -> None:
    """If this fails, a percentage passed as oracle reuse goes unnoticed."""
    with pytest.raises(ValueError, match=r"oracle_reuse=96\.4"):
        compute_measures(RECORDS, 96.4)


def test_record_rejects_reuse_beyond_prompt() -> None:
    """If this fails, a target reporting more cached tokens than the prompt inflates reuse."""
    with pytest.raises(ValueError, match="reused_tokens=11"):
        _record(0, 10, 11, 0.0, (1.0,))


def test_reuse_by_window_is_token_weighted() -> None:
    """If this fails, the per-window reuse plot averages requests instead of tokens."""
    assert reuse_by_window(RECORDS, 2.0) == [(0.0, 1990 / 3000), (2.0, 1010 / 2000)]
