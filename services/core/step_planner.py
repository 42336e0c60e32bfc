"""The step rule the engine's scheduler and the simulator's rank share.

Each step: running items first, oldest first (a decode token or the next prefill chunk each),
then waiting items are admitted first come first served while slots and the token budget last.
When pages run short for a running item it first releases the retained turns of the
conversation that ended a context longest ago (`RetainedConversations`; conversations with an
item waiting or running here go last), then preempts the
newest running item not planned this step (recompute: it re-queues first). An admission that
does not fit after releasing stops the admissions: later items wait behind it.

`StepPlanner` decides; a subclass says what a chunk is and how it takes pages:

| hook                   | engine (`scheduler.py`)          | simulator (`sim_rank.py`)         |
|------------------------|----------------------------------|-----------------------------------|
| `_next_count`          | unfinished tokens, within budget | 1 decode token, or a prefill chunk |
| `_fits` / `_grow`      | `can_allocate` / `allocate`      | the same, only when a page is due |
| `_grow_all`            | a decode step at once (`allocate_all`) | none: one by one      |
| `_admit`               | reuse the match, admit the rest  | the same, counting host/disk pages |
| `_recompute_tokens`    | prompt + output so far           | prompt (output KV not modelled)   |
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from ...kvstore.manager import KVCacheManager
from .retained_order import RetainedConversations


class Schedulable(Protocol):
    """What the rule reads and writes of an item (a sequence, a simulated request)."""

    key: str  # what the kvstore manager tracks it by
    context_done: bool
    retain: bool  # whether its context end still counts as a conversation turn
    retention_seconds: float  # how long its client asked the turn kept (0: the policy's)

    @property
    def conversation_id(self) -> str | None: ...


class Counted(Protocol):
    """A planned chunk: `count` tokens of one item."""

    @property
    def count(self) -> int: ...


ItemT = TypeVar("ItemT", bound=Schedulable)
ChunkT = TypeVar("ChunkT", bound=Counted)


class StepPlanner(Generic[ItemT, ChunkT]):
    """Waiting queue, running set and the step plan over one kvstore manager.

    Within a step only the planner moves items between `waiting` and `running`; between steps
    the owner adds, parks and removes items. The retained order is written only through
    `context_ended` and releases.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        max_batch_size: int,
        token_budget: int,
    ) -> None:
        self.manager = manager
        self.max_batch_size = max_batch_size
        self.token_budget = token_budget
        self.waiting: deque[ItemT] = deque()
        self.running: list[ItemT] = []
        self.preemptions = 0
        self.retained = RetainedConversations(manager, self._awaited_conversations)

    def _awaited_conversations(self) -> list[str | None]:
        """Conversations with an item on this rank: their retained turns are released last."""
        return [item.conversation_id for item in (*self.waiting, *self.running)]

    # -- the step plan -----------------------------------------------------------------------------

    def plan_step(self) -> list[ChunkT]:
        """Pick this step's chunks and take their pages; empty when nothing can run."""
        budget = self.token_budget
        chunks = self._grow_all(budget)
        if chunks is None:
            chunks = self._grow_each(budget)
        budget -= sum(chunk.count for chunk in chunks)
        for item in list(self.waiting):
            if budget == 0 or len(self.running) >= self.max_batch_size:
                break
            if not self._ready(item):
                continue
            chunk = self._admit(item, budget)
            if chunk is None:
                break  # first come, first served: later ones wait behind it
            self.waiting.remove(item)
            self.running.append(item)
            chunks.append(chunk)
            budget -= chunk.count
        return chunks

    def _grow_each(self, budget: int) -> list[ChunkT]:
        """Running items one by one, oldest first, making room for each as needed."""
        chunks: list[ChunkT] = []
        planned: set[ItemT] = set()
        for item in list(self.running):
            if budget == 0:
                break
            if item not in self.running:
                continue  # preempted while making room for an older one
            count = self._next_count(item, budget)
            if count <= 0 or not self._make_room(item, count, planned):
                continue
            chunks.append(self._grow(item, count))
            planned.add(item)
            budget -= count
        return chunks

    def context_ended(self, item: ItemT) -> None:
        """The item's prompt is computed: retain its turn, drop older ones (once per turn)."""
        item.context_done = True
        if item.retain:
            conversation = item.conversation_id or ""
            self.retained.context_ended(item.key, conversation, item.retention_seconds)

    # -- memory pressure ---------------------------------------------------------------------------

    def _make_room(self, item: ItemT, count: int, planned: set[ItemT]) -> bool:
        """Make `count` more tokens of a running item fit: release retained turns, then preempt.

        Items already planned this step are never preempted (their pages are in use).
        """

        def fits() -> bool:
            return self._fits(item, count)

        if self._free_for(fits):
            return True
        while not fits():
            victims = [r for r in self.running if r is not item and r not in planned]
            if not victims:
                return False
            self._preempt(victims[-1])
        return True

    def _free_for(self, fits: Callable[[], bool]) -> bool:
        """`fits()` now or after giving back what is kept but not in use (retained turns); a
        rank that keeps more (held prefetches) gives that back here too."""
        return self.retained.fits_or_release(fits)

    def _preempt(self, victim: ItemT) -> None:
        """Give back a running item's pages; it re-queues first and recomputes."""
        self.running.remove(victim)
        self.manager.finish_request(victim.key)
        tokens = self._recompute_tokens(victim)
        self._track(victim, tokens)
        victim.retain = victim.retain and not victim.context_done
        self._on_preempted(victim, len(tokens))
        self.waiting.appendleft(victim)
        self.preemptions += 1

    # -- hooks -------------------------------------------------------------------------------------

    def _next_count(self, item: ItemT, budget: int) -> int:
        """Tokens a running item computes next, at most `budget`."""
        raise NotImplementedError

    def _fits(self, item: ItemT, count: int) -> bool:
        """True when `count` more tokens of a running item can get their pages now."""
        raise NotImplementedError

    def _grow(self, item: ItemT, count: int) -> ChunkT:
        """Take pages for `count` more tokens of a running item (it fits); its chunk."""
        raise NotImplementedError

    def _grow_all(self, budget: int) -> list[ChunkT] | None:
        """The running items' chunks in one go when that is what `_grow_each` would plan (a
        decode step where every item fits: no room to make); None to plan them one by one."""
        return None

    def _ready(self, item: ItemT) -> bool:
        """True when a waiting item may be admitted now."""
        return True

    def _admit(self, item: ItemT, budget: int) -> ChunkT | None:
        """Admit a waiting item into KV (releasing retained turns if needed); None when short.

        The planner moves it from waiting to running.
        """
        raise NotImplementedError

    def _recompute_tokens(self, victim: ItemT) -> list[int] | tuple[int, ...]:
        """The tokens a preempted item is re-added with."""
        raise NotImplementedError

    def _track(self, item: ItemT, tokens: Sequence[int]) -> None:
        """Let the manager hash the item's `tokens` under its conversation, salt and hints."""
        self.manager.add_request(
            item.key, tokens, item.conversation_id, self._extra_key(item), self._branch_hints(item)
        )

    def _extra_key(self, item: ItemT) -> bytes:
        """The block hash's extra key of an item (a tenant's cache salt); none by default."""
        return b""

    def _branch_hints(self, item: ItemT) -> tuple[int, ...]:
        """Prompt positions where the item's later turns may branch off; none by default."""
        return ()

    def _on_preempted(self, victim: ItemT, num_tokens: int) -> None:
        """Reset a preempted item's own progress; `num_tokens` were re-added."""
