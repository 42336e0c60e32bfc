"""Watches the engine calls a router has in flight: idle streams and removed ranks.

A call whose engine sends nothing for `idle_seconds` (a hung engine) is cancelled and its rank
taken for failed; a call to a rank that was removed (missed heartbeats, or another call found it
dead) is cancelled at once. Either way the request is retried elsewhere if nothing was streamed
yet, else fails with UNAVAILABLE.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

IDLE_REASON = "idle"
REMOVED_REASON = "removed"


class AbandonedStream(Exception):
    """The router cancelled an engine call itself: `reason` is IDLE_REASON or REMOVED_REASON."""

    def __init__(self, rank_id: str, reason: str, detail: str) -> None:
        super().__init__(f"rank {rank_id}: {detail}")
        self.rank_id = rank_id
        self.reason = reason


@dataclass(eq=False)
class WatchedCall:
    """One engine call in flight."""

    rank_id: str
    call: grpc.Call  # cancel() ends it
    last_activity: float
    reason: str | None = None
    detail: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def abandon(self, reason: str, detail: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason, self.detail = reason, detail
        self.call.cancel()

    def error(self) -> AbandonedStream | None:
        """The reason the router cancelled this call, or None when it did not."""
        if self.reason is None:
            return None
        return AbandonedStream(self.rank_id, self.reason, self.detail)


class StreamWatch:
    """The calls in flight, and a thread that cancels idle ones and ones to removed ranks."""

    def __init__(
        self,
        idle_seconds: float,
        registered: Callable[[], set[str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if idle_seconds <= 0:
            raise ValueError(f"stream_idle_seconds: {idle_seconds} <= 0")
        self._idle = idle_seconds
        self._registered = registered
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: set[WatchedCall] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="router-stream-watch", daemon=True)

    def start(self) -> StreamWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def add(self, rank_id: str, call) -> WatchedCall:
        watched = WatchedCall(rank_id, call, self._clock())
        with self._lock:
            self._calls.add(watched)
        return watched

    def touch(self, watched: WatchedCall) -> None:
        watched.last_activity = self._clock()

    def remove(self, watched: WatchedCall) -> None:
        with self._lock:
            self._calls.discard(watched)

    def rank_removed(self, rank_id: str) -> None:
        """Cancel every call to a rank the router removed."""
        for watched in self._in_flight():
            if watched.rank_id == rank_id:
                watched.abandon(REMOVED_REASON, "removed while the call was in flight")

    def _in_flight(self) -> list[WatchedCall]:
        with self._lock:
            return list(self._calls)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self._idle / 4)):
            calls = self._in_flight()
            if not calls:
                continue
            now = self._clock()
            for watched in calls:
                if now - watched.last_activity > self._idle:
                    watched.abandon(IDLE_REASON, f"sent nothing for {self._idle:g} s")
            try:
                registered = self._registered()
            except Exception:  # the store is away: nothing to learn about removals now
                continue
            for watched in calls:
                if watched.rank_id not in registered:
                    watched.abandon(REMOVED_REASON, "removed while the call was in flight")


def watched_chunks(watch: StreamWatch, rank_id: str, call) -> Iterator:
    """An engine call's chunks under the watch; AbandonedStream when the router cancelled it."""
    watched = watch.add(rank_id, call)
    try:
        for chunk in call:
            watch.touch(watched)
            yield chunk
    except grpc.RpcError as error:
        abandoned = watched.error()
        if abandoned is not None:
            raise abandoned from error
        raise
    finally:
        watch.remove(watched)
