"""Conversation bookkeeping: which turns each conversation retains, by conversation id.

The manager owns one `ConversationRetention` and the pools it is built over; only the manager
calls it, so the manager stays the single writer of retention and pools. A conversation appears
at its first retained turn and goes at `drop` (pages nobody else holds are freed) or `release`
(its refs go to the LRU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .block_pool import BlockPool
from .life_cycles import LifeCycle
from .policies import ReusePolicy
from .request_state import RequestState
from .results import DropPlan, TurnRecord, TurnRelease
from .retention import RetainedTurns, drop_turns, release_turn, retain_finished

Block = tuple[int, int]  # (device page, block hash)


class ConversationRetention:
    """Every conversation's `RetainedTurns`, taking and giving back refs in the manager's pools."""

    def __init__(
        self,
        pools: Mapping[str, BlockPool],
        life_cycles: Mapping[str, LifeCycle],
        policy: ReusePolicy,
        block_size: int,
    ) -> None:
        self._pools = pools
        self._life_cycles = life_cycles
        self._policy = policy
        self._block_size = block_size
        self._by_id: dict[str, RetainedTurns] = {}
        # Every change of the retained records counts here, so the page count below is
        # recomputed once per change, not on every read (a load report reads it each step).
        self._changes = 0
        self._counted: tuple[int, int] = (-1, 0)

    def records(self, conversation_id: str) -> tuple[TurnRecord, ...]:
        """Records the conversation holds: a kept root, branch records, then turns oldest first."""
        turns = self._by_id.get(conversation_id)
        return turns.in_order() if turns is not None else ()

    def all_turns(self) -> Iterable[RetainedTurns]:
        """Every conversation's retained turns (for integrity checks; read only)."""
        return self._by_id.values()

    def retained_blocks(self, conversation_id: str | None = None) -> dict[str, list[Block]]:
        """Per life cycle, the distinct `(page, block hash)` pairs that the retained records of
        one conversation (None: of all) hold, newest record first, each in position order:
        what resuming at any of them needs (read only)."""
        if conversation_id is None:
            chosen = list(self._by_id.values())
        else:
            chosen = [self._by_id.get(conversation_id, RetainedTurns())]
        blocks: dict[str, dict[int, int]] = {name: {} for name in self._pools}
        for turns in chosen:
            for record in reversed(turns.in_order()):
                for name, pages in record.pages.items():
                    pool, held = self._pools[name], blocks[name]
                    for page in pages:
                        block_hash = pool.page_hash(page) if page is not None else None
                        if page is not None and block_hash is not None:
                            held.setdefault(page, block_hash)
        return {name: list(held.items()) for name, held in blocks.items() if held}

    def page_count(self) -> int:
        """Distinct pages (per life cycle) that every conversation's retained records hold."""
        changes, count = self._counted
        if changes != self._changes:
            held = {
                (name, page)
                for turns in self._by_id.values()
                for record in turns.in_order()
                for name, pages in record.pages.items()
                for page in pages
                if page is not None
            }
            count = len(held)
            self._counted = (self._changes, count)
        return count

    def retain(self, state: RequestState) -> tuple[DropPlan, ...]:
        """At the request's context end: retain its turn if the policy retains turns and it
        belongs to a conversation; the drop plans of records that fell out."""
        if not self._policy.retained_turns or state.conversation_id is None:
            return ()
        self._changes += 1
        turns = self._by_id.setdefault(state.conversation_id, RetainedTurns())
        pools, life_cycles = self._pools, self._life_cycles
        return retain_finished(turns, state, pools, life_cycles, self._policy, self._block_size)

    def drop(self, conversation_id: str) -> tuple[DropPlan, ...]:
        """Forget the conversation and drop every record it retains (none if unknown)."""
        self._changes += 1
        turns = self._by_id.pop(conversation_id, RetainedTurns())
        return drop_turns(turns.in_order(), self._pools, self._life_cycles)

    def release_branches(self, conversation_id: str) -> tuple[TurnRelease, ...]:
        """Give the refs of the conversation's branch records to the LRU; it keeps its turns."""
        turns = self._by_id.get(conversation_id)
        if turns is None:
            return ()
        self._changes += 1
        records = tuple(turns.branches.values())
        turns.branches.clear()
        return tuple(release_turn(record, self._pools) for record in records)

    def release(self, conversation_id: str) -> tuple[TurnRelease, ...]:
        """Forget the conversation and give its records' refs to the LRU (none if unknown)."""
        self._changes += 1
        turns = self._by_id.pop(conversation_id, RetainedTurns())
        return tuple(release_turn(turn, self._pools) for turn in turns.in_order())
