"""Which conversation gives its retained turns back first under memory pressure.

Conversations are ordered by their last context end, oldest first, except that a conversation
with a request on the rank (`awaited`: waiting or running) goes last: its turn is back, and
releasing it hands the prefix that request is about to reuse to the eviction order first (on
a saturated rank the returning conversation is the one whose context ended longest ago).
Releasing one hands its
retained turns to the LRU (`KVCacheManager.release_conversation`): the pages stay matchable
until evicted, and the tiers offload them to host/disk then, so a returning conversation can
still reuse its prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from ...kvstore.manager import KVCacheManager


class RetainedConversations:
    """The release order of one manager's retained conversations; its only writer."""

    def __init__(
        self, manager: KVCacheManager, awaited: Callable[[], Iterable[str | None]] = tuple
    ) -> None:
        self.manager = manager
        self.awaited = awaited  # conversations with a request on the rank, released last
        self.released = 0  # conversations released so far
        self._order: OrderedDict[str, None] = OrderedDict()

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def context_ended(self, request_id: str, conversation_id: str) -> None:
        """Retain the request's turn (the manager drops older ones) and mark it newest."""
        self.manager.finish_context(request_id)
        if conversation_id and self.manager.retained_turns(conversation_id):
            self._order[conversation_id] = None
            self._order.move_to_end(conversation_id)

    def release_until(self, fits: Callable[[], bool]) -> bool:
        """Release whole conversations' retained turns, oldest first (awaited ones last), until
        `fits()`.

        Returns False when every conversation is released and it still does not fit.
        NOTE: release, not drop: the conversation may come back, and its pages stay matchable
        (and go to host/disk on eviction) instead of being freed. Branch records go first,
        every conversation's, oldest first: they serve only a reset, the turns every next turn.
        """
        for conversation in self._order:
            if self.manager.release_branch_records(conversation) and fits():
                return True
        awaited = set(self.awaited())
        for conversation in sorted(self._order, key=lambda c: c in awaited):  # stable: by age
            del self._order[conversation]
            if self.manager.can_release_conversation(conversation):
                self.released += 1
                self.manager.release_conversation(conversation)
            if fits():
                return True
        return False

    def fits_or_release(self, fits: Callable[[], bool]) -> bool:
        """True if `fits()` now or after releasing conversations, oldest first."""
        return fits() or self.release_until(fits)
