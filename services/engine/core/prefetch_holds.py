"""Conversations' blocks held on the device for their next turn (router-driven prefetch).

Between an agent's turns its retained blocks may have gone to host or disk (memory pressure
released the conversation). When the router expects the next turn (`PrefetchConversation`),
the rank admits a hold: a kvstore request over the conversation's prompt that onboards its
host/disk blocks now, in the tool pause, instead of at the turn's admission. The hold ends:

| when                                           | how                                         |
|------------------------------------------------|---------------------------------------------|
| the conversation's turn is admitted            | `take`: the turn's own match has the pages  |
| `hold_seconds` pass                            | `expire` (each scheduling pass)             |
| memory runs short                              | `cancel_until`: after retained turns are    |
|                                                | released, before any sequence is preempted  |
| the router asks again with another prompt      | the old hold is replaced                    |

A moved turn's pulled prefix (`kvfleet.services.disagg.prefix_pull`) is held the same way
(`keep`) until its turn is admitted; memory pressure gives those up last, after every prefetch.

Only the engine core's thread calls it (the manager has one writer).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ....kvstore.admission import MatchShrankError
from ....kvstore.manager import KVCacheManager
from ....kvstore.tiers.metrics import DISK, HOST

REMEMBERED_PROMPTS = 1024  # conversations whose last prompt a rank keeps for a prefetch


@dataclass(frozen=True)
class PrefetchResult:
    """What one prefetch did."""

    held: bool
    host_blocks: int = 0
    disk_blocks: int = 0


@dataclass(frozen=True)
class _Hold:
    request_id: str
    expires_at: float
    pulled: bool = False  # a moved turn's prefix, whose turn is on its way here


class PrefetchHolds:
    """Holds per conversation and the last prompt of each; the only writer of both."""

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.clock = manager.clock  # holds expire on the rank's clock
        self.cancelled = 0  # holds given up under memory pressure
        self._holds: dict[str, _Hold] = {}
        self._prompts: OrderedDict[str, tuple[tuple[int, ...], bytes]] = OrderedDict()
        self._ids = itertools.count()

    def __contains__(self, conversation_id: str) -> bool:
        return conversation_id in self._holds

    def __len__(self) -> int:
        return len(self._holds)

    def remember(
        self, conversation_id: str | None, prompt: Sequence[int], extra_key: bytes
    ) -> None:
        """A turn of the conversation ended its context here: its prompt is what to bring up."""
        if not conversation_id:
            return
        self._prompts[conversation_id] = (tuple(prompt), extra_key)
        self._prompts.move_to_end(conversation_id)
        while len(self._prompts) > REMEMBERED_PROMPTS:
            self._prompts.popitem(last=False)

    def hold(
        self, conversation_id: str, prompt: Sequence[int] | None, hold_seconds: float
    ) -> PrefetchResult:
        """Onboard the conversation's blocks of `prompt` (None: its last prompt here) and hold
        them for `hold_seconds`; not held when nothing matches or no page is free to take
        without evicting what others hold."""
        remembered = self._prompts.get(conversation_id)
        if prompt is None or not prompt:
            if remembered is None:
                return PrefetchResult(False)
            prompt = remembered[0]
        extra_key = remembered[1] if remembered is not None else b""
        self.release(conversation_id)
        manager = self.manager
        request_id = f"prefetch-{next(self._ids)}"
        manager.add_request(request_id, prompt, None, extra_key)
        match = manager.match(request_id)
        if match.num_reusable_tokens == 0 or not manager.can_admit(request_id, 0):
            manager.finish_request(request_id)
            return PrefetchResult(False)
        host = sum(tier == HOST for where in match.locations.values() for tier in where)
        disk = sum(tier == DISK for where in match.locations.values() for tier in where)
        try:
            manager.admit(request_id, 0)
        except MatchShrankError:  # an unreadable disk block: what is left did not fit
            manager.finish_request(request_id)
            return PrefetchResult(False)
        self._holds[conversation_id] = _Hold(request_id, self.clock() + hold_seconds)
        return PrefetchResult(True, host, disk)

    def keep(self, conversation_id: str, request_id: str, hold_seconds: float) -> None:
        """Hold an admitted kvstore request (a moved turn's pulled prefix) for the
        conversation's turn; it replaces the conversation's hold, if any."""
        self.release(conversation_id)
        self._holds[conversation_id] = _Hold(request_id, self.clock() + hold_seconds, True)

    def take(self, conversation_id: str | None) -> bool:
        """The conversation's turn was admitted (its match took the pages): end the hold."""
        return bool(conversation_id) and self.release(conversation_id or "")

    def release(self, conversation_id: str) -> bool:
        """End a conversation's hold (its pages stay cached, evictable); False when none."""
        hold = self._holds.pop(conversation_id, None)
        if hold is None:
            return False
        self.manager.finish_request(hold.request_id)
        return True

    def expire(self) -> int:
        """End the holds whose time is up; returns how many."""
        now = self.clock()
        late = [c for c, hold in self._holds.items() if hold.expires_at <= now]
        for conversation_id in late:
            self.release(conversation_id)
        return len(late)

    def cancel_until(self, fits: Callable[[], bool], keep: str | None = None) -> bool:
        """Memory pressure: end holds, prefetches before pulled prefixes (their turns are
        already placed here: one given back costs a recompute), the one that lasts longest
        first, until `fits()`; `keep` (the conversation being admitted) is never cancelled."""
        order = sorted(self._holds.items(), key=lambda item: (item[1].pulled, -item[1].expires_at))
        for conversation_id, _ in order:
            if conversation_id == keep:
                continue
            self.release(conversation_id)
            self.cancelled += 1
            if fits():
                return True
        return False
