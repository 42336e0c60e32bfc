"""KV held on a simulated rank for a conversation's next turn: prefetched or pulled in.

A hold is a kvstore request the rank tracks for a conversation between its turns; its pages
are on the device and cannot be evicted. Two things make one:

| source   | what                                                                           |
|----------|--------------------------------------------------------------------------------|
| prefetch | the router expects the next turn (or it waits at the router for a slot here):   |
|          | admit the last prompt, onboarding its host/disk blocks (a side-stream copy)    |
| import   | the turn moved here: the blocks its home (or the shared disk) has and this     |
|          | rank lacks come over the link, as a hand-off's do (`admit_computed`, commit)   |

The conversation's next turn on this rank takes the hold over at its admission (its own match
then finds the pages on the device). A prefetch's onboarding is charged when it runs, as the
engine runs it: on the rank's core thread between steps (`PrefetchHolds.hold` through
`call_on_core`), at what a turn's admission of the same pages costs (`admission_seconds` and
the copies), so the rank's next step starts that much later; the turn that takes the hold over
onboards only what the hold did not bring up.
Memory pressure cancels holds after retained turns are released and before any request is
preempted or refused, prefetches before pulls (a pull's turn is already placed here); a
prefetch also ends at its expiry.

`HoldSide` is that half of `SimRank`, split out for size: the rank is still the only caller
of its manager.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...kvstore.admission import MatchShrankError
from ...kvstore.block_pool import NULL_PAGE
from ...kvstore.tiers.metrics import DISK, HOST
from .sim_clock import ScheduledEvent
from .sim_dispatch import admission_seconds
from .sim_request import SimRequest


@dataclass
class Hold:
    """Pages a rank keeps on the device for one conversation's next turn."""

    hold_id: str
    conversation_id: str
    ready_s: float  # the copy up (or the pull) is done by then
    host_pages: int  # onboarded from this rank's host / disk for it
    disk_pages: int
    pulled: bool = False  # a pull: the turn waits for it (a prefetch late is charged instead)
    expiry: ScheduledEvent | None = None


@dataclass
class HoldStats:
    """What holds did on one rank."""

    prefetches: int = 0  # holds a prefetch made
    host_bytes_in: int = 0  # host -> device bytes prefetches moved
    disk_bytes_in: int = 0  # disk -> device bytes prefetches moved
    imports: int = 0  # holds a pull made
    imported_bytes: int = 0  # bytes pulled from a home rank or the shared disk
    cancelled: int = 0  # holds given up under memory pressure
    expired: int = 0  # holds whose turn never came in time
    taken: int = 0  # holds a turn took over
    late: int = 0  # ... while their copy was still in flight


class HoldSide:
    """Prefetch / import / take over / cancel holds on one rank (mixed into SimRank)."""

    def _init_holds(self) -> None:
        self.holds: dict[str, Hold] = {}
        self.hold_stats = HoldStats()
        self._hold_ids = itertools.count()

    def _lower_pages(self, match) -> tuple[dict[str, int], dict[str, int]]:
        host = {name: sum(t == HOST for t in where) for name, where in match.locations.items()}
        disk = {name: sum(t == DISK for t in where) for name, where in match.locations.items()}
        return host, disk

    def prefetch(self, conversation_id: str, tokens: Sequence[int], hold_for_s: float) -> bool:
        """Bring the conversation's blocks of `tokens` up to the device and hold them until its
        next turn is admitted here or `hold_for_s` passes; False when nothing was held (a hold
        exists, its turn is here already, nothing matches, or it does not fit without taking
        from anyone)."""
        if conversation_id in self.holds or self._has_turn_of(conversation_id):
            return False
        manager = self.manager
        hold_id = f"hold-{self.rank_id}-{next(self._hold_ids)}"
        manager.add_request(hold_id, tokens)
        match = manager.match(hold_id)
        if match.num_reusable_tokens == 0 or not manager.can_admit(hold_id, 0):
            manager.finish_request(hold_id)
            return False
        host, disk = self._lower_pages(match)
        try:
            manager.admit(hold_id, 0)
        except MatchShrankError:  # a block of the shared disk was gone: as the engine, no hold
            manager.finish_request(hold_id)
            return False
        host_pages, disk_pages = sum(host.values()), sum(disk.values())
        # The engine onboards on its core thread, as at a turn's admission: no step meanwhile.
        done_s = self._hold_core(self._onboard_seconds(host_pages, disk_pages))
        hold = Hold(hold_id, conversation_id, done_s, host_pages, disk_pages)
        self._keep(hold, hold_for_s)
        stats = self.hold_stats
        stats.prefetches += 1
        stats.host_bytes_in += self._bytes(host)
        stats.disk_bytes_in += self._bytes(disk)
        return True

    def import_prefix(
        self, conversation_id: str, tokens: Sequence[int], seconds_per_byte: float
    ) -> int:
        """Pull the blocks of `tokens` (a prefix another rank or the shared disk has) that this
        rank lacks and hold them for the conversation's turn; returns the bytes moved (0: it
        lacks nothing, or they do not fit even after releasing retained turns)."""
        manager = self.manager
        hold_id = f"import-{self.rank_id}-{next(self._hold_ids)}"
        manager.add_request(hold_id, tokens)
        held = manager.match(hold_id).num_reusable_tokens
        if held >= len(tokens) - manager.config.block_size or not self._free_until(
            lambda: manager.can_admit_computed(hold_id)
        ):
            manager.finish_request(hold_id)
            return 0
        match = manager.match(hold_id)
        host, disk = self._lower_pages(match)
        allocation = manager.admit_computed(hold_id)
        manager.commit(hold_id, len(tokens))
        new_pages = allocation.new_pages.items()
        moved = self._bytes({name: sum(p != NULL_PAGE for p in pages) for name, pages in new_pages})
        self.release_hold_of(conversation_id)  # a prefetch of the old prefix, if any
        now = self.clock.now()
        ready = now + moved * seconds_per_byte
        ready += sum(host.values()) * self.costs.host_copy_s_per_page
        ready += sum(disk.values()) * self.costs.disk_copy_s_per_page
        self._keep(Hold(hold_id, conversation_id, ready, 0, 0, pulled=True), None)
        self.hold_stats.imports += 1
        self.hold_stats.imported_bytes += moved
        return moved

    def prefix_on_hand(
        self, conversation_id: str, tokens: Sequence[int], retained_only: bool = False
    ) -> int:
        """Tokens of `tokens` this rank could send another rank (its match on any tier);
        `retained_only`: no further than the conversation's retained turns reach (what a drain
        flushed to the shared disk)."""
        manager = self.manager
        probe = f"probe-{self.rank_id}-{next(self._hold_ids)}"
        manager.add_request(probe, tokens)
        try:
            found = manager.match(probe).num_reusable_tokens
        finally:
            manager.finish_request(probe)
        if not retained_only:
            return found
        full = [name for name, lc in manager.life_cycles.items() if lc.kind == "full"]
        reach = 0
        for record in manager.retained_turns(conversation_id):
            for name in full:
                pages = record.pages.get(name, ())
                kept = next((i for i, page in enumerate(pages) if page is None), len(pages))
                reach = max(reach, kept * manager.config.block_size)
        return min(found, reach)

    def _onboard_seconds(self, host_pages: int, disk_pages: int) -> float:
        """The core thread's time for a prefetch's add and admission: what a turn admitted with
        the same pages onboarded costs its rank (`admission_seconds`, then the copies its step
        would make), since the engine runs both on its core thread the same way."""
        costs = self.costs
        copy_s = host_pages * costs.host_copy_s_per_page + disk_pages * costs.disk_copy_s_per_page
        if self.hardware is None:
            return copy_s
        return admission_seconds(self.hardware, 1, host_pages, disk_pages) + copy_s

    def take_hold(self, request: SimRequest) -> Hold | None:
        """The conversation's turn is being admitted: the hold's pages become its own match."""
        hold = self.holds.pop(request.conversation_id, None)
        if hold is None:
            return None
        if hold.expiry is not None:
            hold.expiry.cancel()
        self.manager.finish_request(hold.hold_id)
        self.hold_stats.taken += 1
        if hold.ready_s > self.clock.now():
            self.hold_stats.late += 1
        return hold

    def ready_at(self, request: SimRequest) -> float:
        """When the request's hold (a pull in flight) lets it be admitted."""
        hold = self.holds.get(request.conversation_id)
        return hold.ready_s if hold is not None and hold.pulled else 0.0

    def release_hold_of(self, conversation_id: str) -> bool:
        """Give a conversation's hold back (its pages stay cached, evictable)."""
        hold = self.holds.pop(conversation_id, None)
        if hold is None:
            return False
        if hold.expiry is not None:
            hold.expiry.cancel()
        self.manager.finish_request(hold.hold_id)
        return True

    def _cancel_holds_until(self, fits: Callable[[], bool], keep: str = "") -> bool:
        """Memory pressure: give holds back until `fits()`: prefetches first (the one expected
        latest first), pulls last (their turns are already placed here and wait for them; a
        pull given back costs a recompute, a request refused for it costs more)."""
        for conversation_id in sorted(
            (c for c in self.holds if c != keep),
            key=lambda c: (
                self.holds[c].pulled,
                -(self.holds[c].expiry.when if self.holds[c].expiry else 0.0),
            ),
        ):
            self.release_hold_of(conversation_id)
            self.hold_stats.cancelled += 1
            if fits():
                return True
        return False

    def _free_until(self, fits: Callable[[], bool], keep: str = "") -> bool:
        """`fits()` now, or after releasing retained turns, or after cancelling holds."""
        return self.retained.fits_or_release(fits) or self._cancel_holds_until(fits, keep)

    def _keep(self, hold: Hold, hold_for_s: float | None) -> None:
        self.holds[hold.conversation_id] = hold
        if hold_for_s is None:
            return

        def expire() -> None:
            if self.holds.get(hold.conversation_id) is hold:
                self.release_hold_of(hold.conversation_id)
                self.hold_stats.expired += 1

        hold.expiry = self.clock.call_at(self.clock.now() + hold_for_s, expire)

    def _has_turn_of(self, conversation_id: str) -> bool:
        return any(r.conversation_id == conversation_id for r in (*self.waiting, *self.running))

    def _bytes(self, pages: dict[str, int]) -> int:
        return sum(count * self.page_bytes[name] for name, count in pages.items())
