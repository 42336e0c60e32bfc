"""The one retry loop of a forwarded turn: place it, stream it, and on a failure decide again.

Both placements of a turn run it: the first (any rank, or a context rank) and the generation
half of a hand-off. What a failed attempt leads to:

| what happened                          | the loop                                           |
|----------------------------------------|----------------------------------------------------|
| a request-level status, or the client  | EngineRejected with the engine's status            |
| left, or "full" after output was sent  |                                                    |
| rank gone (UNAVAILABLE, CANCELLED), a  | before output: the rank is removed (an abandoned   |
| stream ended before the turn finished, | one only when idle) and the turn placed again, up  |
| a stream abandoned by the watch        | to `max_attempts` ranks; after output: UNAVAILABLE |
| rank full (RESOURCE_EXHAUSTED)         | queued again after a doubling pause, until the     |
|                                        | router's queue limit (QueueTimeout) or, where set, |
|                                        | `max_full_requeues`                                |
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import grpc

from ...proto import router_pb2
from .engine_outcomes import Outcome, full_backoff, outcome_of
from .errors import EngineRejected, QueueTimeout, RankUnavailable
from .model import Admission
from .stream_watch import IDLE_REASON, AbandonedStream

log = logging.getLogger(__name__)


class TruncatedStream(Exception):
    """An engine closed the stream before the turn (every sample of it) finished."""


@dataclass(frozen=True)
class RetryRules:
    """How one pool's placements are retried."""

    ranks: str  # how errors and logs name the pool's ranks: "rank", "generation rank"
    max_attempts: int  # ranks lost before output, then UNAVAILABLE
    max_full_requeues: int | None = None  # times turned away as full (None: queue limit only)


# Forward one admitted attempt; `first` is true while nothing of the turn was sent this loop.
Forward = Callable[[Admission, bool], Iterator[router_pb2.GenerateResponse]]


class RetryLoop:
    """Runs the attempts of one pool's placement; the servicer and the hand-off each own one."""

    def __init__(self, runtime, clock: Callable[[], float], rules: RetryRules) -> None:
        self._runtime = runtime
        self._clock = clock
        self._rules = rules

    def run(
        self,
        request_id: str,
        context,
        admit: Callable[[], Admission | None],
        forward: Forward,
        lost_before_output: Callable[[str], None] = lambda reason: None,
    ) -> Generator[router_pb2.GenerateResponse, None, Admission | None]:
        """Stream the turn's responses; return the admission that finished it (its slot is
        given back already), or None when the client left.

        `admit` queues the turn and waits for a slot (None: the client left while queued).
        `lost_before_output(reason)` hears of each rank lost before output and may raise to
        stop retrying (a strict explicit rank)."""
        ranks = self._rules.ranks
        started = self._clock()  # the queue limit counts from here
        sent = failures = times_full = 0
        while True:
            admission = admit()
            if admission is None:
                return None
            rank_id = admission.rank.rank_id
            reason = ""
            try:
                for response in forward(admission, sent == 0):
                    sent += 1
                    yield response
                return admission
            except grpc.RpcError as error:
                outcome = outcome_of(error.code())
                if (
                    outcome is Outcome.REQUEST_FAILED
                    or (outcome is Outcome.RANK_FULL and sent)
                    or not context.is_active()
                ):
                    raise EngineRejected(
                        error.code(), f"{ranks} {rank_id}: {error.details()}"
                    ) from error
                if outcome is Outcome.RANK_GONE:
                    reason = f"{error.code().name} {error.details()}"
                    self._runtime.rank_failed(rank_id, error.details() or "")
            except TruncatedStream as error:
                reason = str(error)
                self._runtime.rank_failed(rank_id, reason)
            except AbandonedStream as error:
                reason = str(error)
                if error.reason == IDLE_REASON:  # a hung engine; a removed one is gone already
                    self._runtime.rank_failed(rank_id, reason)
            finally:
                self._runtime.finish(admission)
            if not reason:  # the rank was full: queue again after a short pause
                times_full += 1
                self._runtime.metrics.requeued_full.inc()
                if not self._pause(context, times_full, started):
                    return None
                continue
            if sent:
                raise RankUnavailable(
                    f"{ranks} {rank_id} failed after {sent} chunks were sent ({reason}); "
                    "retry the request"
                )
            lost_before_output(reason)
            failures += 1
            if failures >= self._rules.max_attempts:
                raise RankUnavailable(f"{failures} {ranks}s failed before producing output")
            self._runtime.metrics.retries.inc()
            log.warning(
                "request %s: %s %s failed before output (%s), attempt %d of %d",
                request_id,
                ranks,
                rank_id,
                reason,
                failures,
                self._rules.max_attempts,
            )

    def _pause(self, context, times_full: int, started: float) -> bool:
        """Wait before queueing a turn a full rank turned away again; False: the client left.

        QueueTimeout once the wait would pass the router's queue limit."""
        ranks = self._rules.ranks
        seconds = full_backoff(times_full)
        limit = self._runtime.max_queue_seconds
        if self._clock() - started + seconds > limit:
            raise QueueTimeout(f"no {ranks} had room within {limit:g} s ({ranks}s reported full)")
        most = self._rules.max_full_requeues
        if most is not None and times_full > most:
            raise EngineRejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"{ranks}s had no room {times_full} times"
            )
        time.sleep(seconds)
        return context.is_active()
