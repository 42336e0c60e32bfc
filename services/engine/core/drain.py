"""Scale-in drain on the engine core: a leaving rank's conversations go to the shared disk.

The operator marks a leaving pod draining (`podinfo.py`); the router then places no new
conversation here while the turns pinned here go on. So that a conversation's next turn, placed
on another rank, still finds its prefix, the core writes to the shared disk tier every block
such a turn would reuse here:

| when                                   | what is written                                      |
|----------------------------------------|------------------------------------------------------|
| the rank turns draining                | every conversation's retained turns; then, oldest    |
|                                        | first, where each conversation's last finished turn  |
|                                        | ends (prompt and output: its next turn's prefix)      |
|                                        | while those blocks are still on the device           |
| a turn ends its context while draining | that conversation's retained turns                   |
| a turn finishes while draining         | where it ends (a turn running or queued when the     |
|                                        | drain started, whose output the first write missed)  |

Each write skips blocks the disk already has, so none is written twice. The device keeps them
all: the rank serves its pinned turns until it leaves, and a leaving rank waits for its
running and queued turns before it stops (`EngineRank.drain_and_stop`).

Only the engine core's thread calls `DiskDrain` (the manager has one writer); other threads go
through `EngineCore.set_draining`, which queues a command.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from prometheus_client import Counter

from ....kvstore.manager import KVCacheManager, UnknownRequestError

log = logging.getLogger(__name__)

REMEMBERED_ENDS = 1024  # conversations whose last finished turn's end a rank keeps


class DiskDrain:
    """Whether the rank drains, and the writes of its conversations' blocks to the shared disk."""

    def __init__(self, manager: KVCacheManager, flushed_blocks: Counter) -> None:
        self.manager = manager
        self.draining = False
        self._flushed = flushed_blocks
        # Conversation -> ids of the full blocks its last finished turn computed here.
        self._ends: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def set_draining(self, draining: bool) -> int:
        """Take the rank's drain mark; on turning draining write every conversation's retained
        turns and last turn's end. Returns the blocks written."""
        turned = draining and not self.draining
        self.draining = draining
        if not turned:
            return 0
        written = self._flush(None)
        # Oldest first: on a disk tier too small for all, the newest ends are the ones kept.
        for block_ids in list(self._ends.values()):
            written += self._write_end(block_ids)
        log.info("rank draining: %d blocks written to the shared disk tier", written)
        return written

    def context_ended(self, conversation_id: str | None) -> int:
        """A turn of `conversation_id` ended its context (and was retained): while draining,
        flush that conversation's retained turns. Returns the blocks written."""
        if not self.draining or conversation_id is None:
            return 0
        return self._flush(conversation_id)

    def turn_finished(self, request_key: str, conversation_id: str | None) -> int:
        """A turn of `conversation_id` finished (before its pages are given back): remember
        where it ends; while draining, write what resuming there needs. Returns the blocks
        written."""
        if conversation_id is None:
            return 0
        try:
            block_ids = self.manager.computed_block_ids(request_key)
        except UnknownRequestError:  # its pages went with a hand-off
            return 0
        self._ends[conversation_id] = block_ids
        self._ends.move_to_end(conversation_id)
        while len(self._ends) > REMEMBERED_ENDS:
            self._ends.popitem(last=False)
        return self._write_end(block_ids) if self.draining else 0

    def _flush(self, conversation_id: str | None) -> int:
        written = self.manager.flush_retained_to_disk(conversation_id)
        self._flushed.inc(written)
        return written

    def _write_end(self, block_ids: tuple[int, ...]) -> int:
        written = self.manager.flush_resume_point_to_disk(block_ids)
        self._flushed.inc(written)
        return written
