"""Affinity and placement policies, picked by name from small registries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .model import PendingRequest, RankSlots
from .prefix_index import PrefixIndex


@dataclass(frozen=True)
class WaitBound:
    """How long a pinned request may wait for its home rank: passes and seconds."""

    max_passes: int
    max_seconds: float

    def __post_init__(self) -> None:
        if self.max_passes < 0:
            raise ValueError(f"max_wait_passes: {self.max_passes} < 0")
        if self.max_seconds < 0:
            raise ValueError(f"max_wait_seconds: {self.max_seconds} < 0")


class AffinityPolicy(Protocol):
    name: str
    keeps_home: bool  # False: the pin is not even a preference (placed as a new request)

    def waits_for_home(self, request: PendingRequest, waited: float, bound: WaitBound) -> bool:
        """Whether a pinned request whose home rank is full keeps waiting for it."""

    def still_pinned(
        self, request: PendingRequest, waited: float, bound: WaitBound, home_has_room: bool
    ) -> bool:
        """Whether a pinned request is admitted in the pinned group of this pass."""


class StrictAffinity:
    """A pinned request waits for its home rank until the bound in passes or seconds."""

    name = "strict"
    keeps_home = True

    def waits_for_home(self, request: PendingRequest, waited: float, bound: WaitBound) -> bool:
        return request.deferrals < bound.max_passes and waited < bound.max_seconds

    def still_pinned(
        self, request: PendingRequest, waited: float, bound: WaitBound, home_has_room: bool
    ) -> bool:
        # By eligibility, not by the pin: a request past its bound is placed like a new one.
        return self.waits_for_home(request, waited, bound)


class LenientAffinity:
    """A pinned request goes home only when its home has room; otherwise anywhere."""

    name = "lenient"
    keeps_home = True

    def waits_for_home(self, request: PendingRequest, waited: float, bound: WaitBound) -> bool:
        return False

    def still_pinned(
        self, request: PendingRequest, waited: float, bound: WaitBound, home_has_room: bool
    ) -> bool:
        return home_has_room


class NoAffinity:
    """Pins are ignored: every request is placed as a new one (with round robin placement, the
    prefix-blind router that affinity is measured against)."""

    name = "none"
    keeps_home = False

    def waits_for_home(self, request: PendingRequest, waited: float, bound: WaitBound) -> bool:
        return False

    def still_pinned(
        self, request: PendingRequest, waited: float, bound: WaitBound, home_has_room: bool
    ) -> bool:
        return False


AFFINITY_POLICIES: dict[str, AffinityPolicy] = {
    policy.name: policy for policy in (StrictAffinity(), LenientAffinity(), NoAffinity())
}


class PlacementPolicy(Protocol):
    def order(self, request: PendingRequest, candidates: list[RankSlots]) -> list[RankSlots]:
        """Candidate ranks (each with room for the request), best first."""


def _load_key(slots: RankSlots) -> tuple:
    # Most free slots first, then lowest reported KV usage, then a stable tie-break.
    return (-slots.free, slots.load.kv_usage, slots.info.rank_id)


class LoadPlacement:
    """The least loaded rank."""

    def __init__(self, index: PrefixIndex | None = None) -> None:
        del index

    def order(self, request: PendingRequest, candidates: list[RankSlots]) -> list[RankSlots]:
        return sorted(candidates, key=_load_key)


class PrefixPlacement:
    """The rank holding the longest prefix of the prompt (from KV events), then by load."""

    def __init__(self, index: PrefixIndex) -> None:
        self._index = index

    def order(self, request: PendingRequest, candidates: list[RankSlots]) -> list[RankSlots]:
        def overlap(slots: RankSlots) -> int:
            keys = request.keys_for(slots.info.block_size)
            return self._index.overlap(slots.info.rank_id, keys)

        return sorted(candidates, key=lambda slots: (-overlap(slots), *_load_key(slots)))


class RoundRobinPlacement:
    """Ranks in turn by id, blind to prefix and load: the baseline of routers that ignore the
    KV cache. The turn advances once per placement asked for."""

    def __init__(self, index: PrefixIndex | None = None) -> None:
        del index
        self._turn = 0

    def order(self, request: PendingRequest, candidates: list[RankSlots]) -> list[RankSlots]:
        ranked = sorted(candidates, key=lambda slots: slots.info.rank_id)
        if not ranked:
            return ranked
        start = self._turn % len(ranked)
        self._turn += 1
        return ranked[start:] + ranked[:start]


PLACEMENT_POLICIES: dict[str, Callable[[PrefixIndex], PlacementPolicy]] = {
    "load": LoadPlacement,
    "prefix": PrefixPlacement,
    "round_robin": RoundRobinPlacement,
}
