"""Which conversation gives its retained turns back first under memory pressure.

Conversations are ordered by their last context end, oldest first, except that a conversation
whose retention time (a client's cache TTL: Anthropic `cache_control.ttl`, OpenAI
`prompt_cache_retention`) has not run out since its last context end goes after those with
none left, and a conversation with a request on the rank (`awaited`: waiting or running) goes
last of all: its turn is back, and releasing it hands the prefix that request is about to reuse
to the eviction order first (on a saturated rank the returning conversation is the one whose
context ended longest ago). A conversation inside its retention time is released only when
everything else is already released and the rank still needs the room: a running request is
never preempted, nor a new one refused for ever, to keep an idle cache (`released_early`
counts those). Releasing one hands its
retained turns to the LRU (`KVCacheManager.release_conversation`): the pages stay matchable
until evicted, and the tiers offload them to host/disk then, so a returning conversation can
still reuse its prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from ...kvstore.deadlines import Deadlines
from ...kvstore.manager import KVCacheManager


class RetainedConversations:
    """The release order of one manager's retained conversations; its only writer."""

    def __init__(
        self,
        manager: KVCacheManager,
        awaited: Callable[[], Iterable[str | None]] = tuple,
    ) -> None:
        self.manager = manager
        self.awaited = awaited  # conversations with a request on the rank, released last
        self.clock = manager.clock  # retention times run on the rank's clock, as the tiers' TTLs
        self.released = 0  # conversations released so far
        self.released_early = 0  # ... of them, inside their retention time
        self._order: OrderedDict[str, None] = OrderedDict()
        self._keep_until: Deadlines[str] = Deadlines()  # conversation -> end of its retention

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def context_ended(
        self, request_id: str, conversation_id: str, retention_seconds: float = 0.0
    ) -> None:
        """Retain the request's turn (the manager drops older ones) and mark it newest; a
        retention time keeps it from release that long from now (a later turn of the
        conversation refreshes it, never shortens it)."""
        self.manager.finish_context(request_id)
        if conversation_id and self.manager.retained_turns(conversation_id):
            self._order[conversation_id] = None
            self._order.move_to_end(conversation_id)
            if retention_seconds > 0:
                self._keep_until.extend([conversation_id], self.clock() + retention_seconds)

    def kept_until(self, conversation_id: str) -> float | None:
        """When the conversation's retention time runs out (None: it has none, or it ran out)."""
        return self._keep_until.until(conversation_id, self.clock())

    def release_until(self, fits: Callable[[], bool]) -> bool:
        """Release whole conversations' retained turns, oldest first (awaited ones last), until
        `fits()`.

        Returns False when every conversation is released and it still does not fit.
        NOTE: release, not drop: the conversation may come back, and its pages stay matchable
        (and go to host/disk on eviction) instead of being freed. Branch records go first,
        every conversation's outside its retention time, oldest first: they serve only a reset,
        the turns every next turn.
        """
        for conversation in self._order:
            if self.kept_until(conversation) is not None:
                continue  # its branch points are what its client asked to keep
            if self.manager.release_branch_records(conversation) and fits():
                return True
        awaited = set(self.awaited())
        kept = {c: until for c in self._order if (until := self.kept_until(c)) is not None}
        for conversation in self._release_order(awaited, set(kept)):
            del self._order[conversation]
            self._keep_until.discard(conversation)
            if self.manager.can_release_conversation(conversation):
                self.released += 1
                self.released_early += conversation in kept
                # inside its TTL: the host and disk tiers keep its blocks after all others
                left = kept[conversation] - self.clock() if conversation in kept else 0.0
                self.manager.release_conversation(conversation, left)
            if fits():
                return True
        return False

    def _release_order(self, awaited: set[str | None], kept: set[str]) -> list[str]:
        """Oldest first; those inside their retention time after the rest, awaited ones last."""
        return sorted(self._order, key=lambda c: (c in awaited, c in kept))  # stable: by age

    def fits_or_release(self, fits: Callable[[], bool]) -> bool:
        """True if `fits()` now or after releasing conversations, oldest first."""
        return fits() or self.release_until(fits)
