"""Scale-in drain on the engine core: a leaving rank's retained prefixes go to the shared disk.

The operator marks a leaving pod draining (`podinfo.py`); the router then places no new
conversation here while the turns pinned here go on. So that a conversation's next turn, placed
on another rank, still finds its prefix, the core writes every retained turn's blocks to the
shared disk tier once when the rank turns draining, and a conversation's again each time one of
its turns ends a context while the rank is still draining. The device keeps them all: the rank
serves its pinned turns until it leaves.

Only the engine core's thread calls `DiskDrain` (the manager has one writer); other threads go
through `EngineCore.set_draining`, which queues a command.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from ....kvstore.manager import KVCacheManager

log = logging.getLogger(__name__)


class DiskDrain:
    """Whether the rank drains, and the flushes of its retained turns to the shared disk."""

    def __init__(self, manager: KVCacheManager, flushed_blocks: Counter) -> None:
        self.manager = manager
        self.draining = False
        self._flushed = flushed_blocks

    def set_draining(self, draining: bool) -> int:
        """Take the rank's drain mark; on turning draining flush every conversation's retained
        turns. Returns the blocks written."""
        turned = draining and not self.draining
        self.draining = draining
        if not turned:
            return 0
        written = self._flush(None)
        log.info("rank draining: %d retained blocks written to the shared disk tier", written)
        return written

    def context_ended(self, conversation_id: str | None) -> int:
        """A turn of `conversation_id` ended its context (and was retained): while draining,
        flush that conversation's retained turns. Returns the blocks written."""
        if not self.draining or conversation_id is None:
            return 0
        return self._flush(conversation_id)

    def _flush(self, conversation_id: str | None) -> int:
        written = self.manager.flush_retained_to_disk(conversation_id)
        self._flushed.inc(written)
        return written
