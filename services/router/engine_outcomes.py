"""What an engine's error status says about the rank: gone, full, or this request alone.

| status                                   | meaning               | the router                  |
|------------------------------------------|-----------------------|-----------------------------|
| UNAVAILABLE, CANCELLED (by the server)   | the rank is gone      | removes it; retries the     |
|                                          |                       | request elsewhere if nothing|
|                                          |                       | was streamed yet            |
| RESOURCE_EXHAUSTED                       | the rank is full      | requeues the request (the   |
|                                          |                       | rank stays)                 |
| anything else (INVALID_ARGUMENT,         | this request failed   | passes the status on; the   |
| OUT_OF_RANGE, FAILED_PRECONDITION,       |                       | rank stays, no retry        |
| INTERNAL, ABORTED, ...)                  |                       |                             |

A rank is removed only for a transport failure or missed heartbeats: one bad request (a
sampler error, a prompt too long for the model) must not take a healthy rank out of the fleet.
"""

from __future__ import annotations

import enum

import grpc

RANK_FAILURE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
RANK_FULL_CODES = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
# A request the rank turned away as full waits this long (doubling, capped) before it is
# queued again, so a router that believes the rank has room does not spin on it.
FULL_BACKOFF_SECONDS = 0.02
FULL_BACKOFF_CAP_SECONDS = 0.5


class Outcome(enum.Enum):
    RANK_GONE = "rank_gone"
    RANK_FULL = "rank_full"
    REQUEST_FAILED = "request_failed"


def outcome_of(code: grpc.StatusCode) -> Outcome:
    """What an engine's status code means for the rank that sent it."""
    if code in RANK_FAILURE_CODES:
        return Outcome.RANK_GONE
    if code in RANK_FULL_CODES:
        return Outcome.RANK_FULL
    return Outcome.REQUEST_FAILED


def full_backoff(times_full: int) -> float:
    """Seconds to wait before requeueing a request turned away `times_full` times."""
    return min(FULL_BACKOFF_CAP_SECONDS, FULL_BACKOFF_SECONDS * 2 ** max(0, times_full - 1))
