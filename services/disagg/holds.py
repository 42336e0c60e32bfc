"""Requests a context rank parked after prefill: their pages wait to be pulled, up to a deadline.

One writer: the engine core thread (parking, pulls and expiry all run there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    """A parked request: the manager still tracks `key` and holds its pages."""

    request_id: str
    key: str
    prompt: tuple[int, ...]
    parked_at: float
    deadline: float
    extra_key: bytes = b""  # what the manager hashed the prompt's blocks under (the salt)


class HandoffHolds:
    """Parked requests by request id."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._holds

    def park(self, hold: Hold) -> None:
        """Keep a request's pages until `take` or its deadline."""
        if hold.request_id in self._holds:
            raise ValueError(f"request {hold.request_id!r} is already parked")
        self._holds[hold.request_id] = hold

    def take(self, request_id: str) -> Hold | None:
        """Remove and return a hold (the caller releases its pages); None when absent."""
        return self._holds.pop(request_id, None)

    def expired(self, now: float) -> list[Hold]:
        """Remove and return the holds whose deadline passed."""
        done = [hold for hold in self._holds.values() if hold.deadline <= now]
        for hold in done:
            del self._holds[hold.request_id]
        return done

    def all(self) -> list[Hold]:
        """Remove and return every hold (the core is stopping)."""
        holds = list(self._holds.values())
        self._holds.clear()
        return holds
