"""Keys kept until a time: the clients' cache TTLs, for conversations and for blocks.

A key past its time counts as not kept and is forgotten when read, or by `prune`. Times come
from the caller's clock (the rank's, virtual in the simulator), passed in as `now`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    """key -> the time until which it is kept; its owner is the only writer."""

    def __init__(self) -> None:
        self._until: dict[K, float] = {}

    def extend(self, keys: Iterable[K], until: float) -> None:
        """Keep each key until `until` at least (a later time it has already stays)."""
        for key in keys:
            self._until[key] = max(until, self._until.get(key, until))

    def until(self, key: K, now: float) -> float | None:
        """When the key's time runs out; None when it has none or it ran out by `now`."""
        until = self._until.get(key)
        if until is not None and until <= now:
            del self._until[key]
            return None
        return until

    def discard(self, key: K) -> None:
        """Forget the key's time."""
        self._until.pop(key, None)

    def prune(self, now: float) -> None:
        """Forget every time that ran out by `now` (keys that are never read again)."""
        self._until = {key: until for key, until in self._until.items() if until > now}
