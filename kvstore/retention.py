"""Conversation retention: the turns a conversation keeps, taking and giving back their refs.

The manager owns every `RetainedTurns` and pool; these helpers change only those it hands them.

A conversation retains its last `recent_turns` turns and, when the policy keeps a root, the
first turn retained since the conversation began (or was last released) besides them:

| turn k finished (N = recent_turns) | retained without root | retained with root       |
|------------------------------------|-----------------------|--------------------------|
| k <= N                             | 1..k                  | 1..k                     |
| k = N + 1                          | 2..N+1                | 1 (root), 2..N+1         |
| k > N + 1                          | k-N+1..k              | 1 (root), k-N+1..k       |

Each retained turn holds its endpoint and checkpoint pages and, on state life cycles, its own
snapshot at every offset from its prompt end; turns share attention pages and periodic
snapshots through their common prefix (one page, one ref per holder).

Besides them it holds up to `keep_branch_points` branch records (`branch_points.py`), keyed by
the block id at the branch point and kept in least-recently-used order.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .block_pool import BlockPool
from .drop_plan import build_drop_plan
from .life_cycles import LifeCycle
from .policies import ReusePolicy
from .request_state import RequestState
from .results import DropPlan, TurnRecord, TurnRelease


@dataclass
class RetainedTurns:
    """One conversation's retained turns: its root (None: none kept), its branch records (by
    the block id at the branch point, least recently used first) and its recent turns."""

    root: TurnRecord | None = None
    recent: deque[TurnRecord] = field(default_factory=deque)
    branches: OrderedDict[int, TurnRecord] = field(default_factory=OrderedDict)

    def in_order(self) -> tuple[TurnRecord, ...]:
        """Every retained record: the root, the branch records, then the turns oldest first."""
        root = (self.root,) if self.root is not None else ()
        return root + tuple(self.branches.values()) + tuple(self.recent)

    def add(self, turn: TurnRecord, recent_turns: int, keep_root: bool) -> list[TurnRecord]:
        """Retain `turn`; return the turns that fell out (oldest first), for the caller to drop."""
        if keep_root and self.root is None and not self.recent:
            self.root = turn
            return []
        self.recent.append(turn)
        fallen = []
        while len(self.recent) > recent_turns:
            fallen.append(self.recent.popleft())
        return fallen

    def add_branch(self, key: int, branch: TurnRecord, keep: int) -> list[TurnRecord]:
        """Hold `branch` under `key` as the most recent; return the records beyond `keep`, and
        the record it replaces under the same key (its refs go back with the others)."""
        replaced = self.branches.pop(key, None)
        fallen = [replaced] if replaced is not None else []
        self.branches[key] = branch
        while len(self.branches) > keep:
            fallen.append(self.branches.popitem(last=False)[1])
        return fallen

    def touch_branch(self, key: int) -> None:
        """A turn resumed at the branch under `key` (if held): make it the most recent."""
        if key in self.branches:
            self.branches.move_to_end(key)


def retain_finished(
    turns: RetainedTurns,
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    policy: ReusePolicy,
    block_size: int,
) -> tuple[DropPlan, ...]:
    """At a context end: retain the request's turn (and its branch point) in `turns`, drop the
    records that fell out beyond the policy's counts; their drop plans."""
    turn = retain_turn(state, pools, life_cycles, block_size)
    fallen = turns.add(turn, policy.recent_turns, policy.keep_root)
    if state.num_reused_tokens:  # a turn that resumed at a held branch point refreshes it
        turns.touch_branch(state.sequence.hashes[state.num_reused_tokens // block_size - 1])
    for branch_tokens in state.branch_tokens:
        key, branch = retain_branch(state, pools, life_cycles, block_size, branch_tokens)
        fallen.extend(turns.add_branch(key, branch, policy.keep_branch_points))
    return drop_turns(fallen, pools, life_cycles)


def retain_turn(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    block_size: int,
) -> TurnRecord:
    """Take a ref on every committed page needed to resume at the endpoint and checkpoint, and
    on the turn's own snapshots at each from-end offset (a later prompt's move with it)."""
    positions = [state.prompt_len // block_size]
    if state.checkpoint_tokens is not None:
        positions.append(state.checkpoint_tokens // block_size)
    pages = _hold(state, pools, life_cycles, block_size, positions, from_end=True)
    return TurnRecord(state.conversation_id or "", state.request_id, pages)


def retain_branch(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    block_size: int,
    branch_tokens: int,
) -> tuple[int, TurnRecord]:
    """Take a ref on every committed page needed to resume at one of the request's branch
    points; the block id there (the record's key) and the record."""
    if branch_tokens not in state.branch_tokens:
        raise ValueError(f"request {state.request_id!r} has no branch point at {branch_tokens}")
    blocks = branch_tokens // block_size
    pages = _hold(state, pools, life_cycles, block_size, [blocks])
    record = TurnRecord(state.conversation_id or "", state.request_id, pages, branch_tokens)
    return state.sequence.hashes[blocks - 1], record


def _hold(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    block_size: int,
    positions: list[int],
    from_end: bool = False,
) -> dict[str, tuple[int | None, ...]]:
    """Ref the committed pages every reusable life cycle needs to resume at `positions` (and,
    with `from_end`, the from-end snapshots that are still cached: a missing one is no loss
    of the turn's resume points, so it never blocks a drop plan)."""
    hashes = state.sequence.hashes
    pages: dict[str, tuple[int | None, ...]] = {}
    for name, life_cycle in life_cycles.items():
        if not life_cycle.reusable:
            continue
        indices = {i for k in positions for i in life_cycle.resume_blocks(k, block_size)}
        found = tuple(pools[name].lookup(hashes[index]) for index in sorted(indices))
        if from_end:
            extra = life_cycle.from_end_blocks(state.prompt_len, block_size) - indices
            looked_up = (pools[name].lookup(hashes[index]) for index in sorted(extra))
            found += tuple(page for page in looked_up if page is not None)
        for page in found:
            if page is not None:
                pools[name].ref(page)
        pages[name] = found
    return pages


def cached_resume_blocks(
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    block_size: int,
    block_ids: Sequence[int],
) -> dict[str, list[tuple[int, int]]]:
    """Per reusable life cycle, the `(page, block id)` pairs, in position order, that resuming
    after `block_ids` (a prefix's full blocks) needs, held or cached on the device; empty
    unless every one of them is (read only).

    NOTE: a resume point with a block missing is of no use to anyone (a window life cycle
    commits no block past a prompt's end, evictions take others), so none of it is returned."""
    blocks: dict[str, list[tuple[int, int]]] = {}
    for name, life_cycle in life_cycles.items():
        if not life_cycle.reusable:
            continue
        indices = life_cycle.resume_blocks(len(block_ids), block_size)
        pairs = []
        for index in indices:
            page = pools[name].lookup(block_ids[index])
            if page is None:
                return {}
            pairs.append((page, block_ids[index]))
        if pairs:
            blocks[name] = pairs
    return blocks


def drop_turns(
    turns: Iterable[TurnRecord],
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
) -> tuple[DropPlan, ...]:
    """Drop each of `turns` in order (`drop_turn`); the plans of those that had one."""
    return tuple(plan for turn in turns for plan in drop_turn(turn, pools, life_cycles))


def drop_turn(
    turn: TurnRecord, pools: Mapping[str, BlockPool], life_cycles: Mapping[str, LifeCycle]
) -> list[DropPlan]:
    """Release a turn's pages; free those nobody else holds (no plan: leave them to LRU)."""
    plan = build_drop_plan(turn, life_cycles, lambda n, p: pools[n].ref_count(p))
    release_turn(turn, pools)
    if plan is None:
        return []
    for name, pages in plan.dropped.items():
        for page in pages:
            pools[name].drop(page)
    return [plan]


def release_turn(turn: TurnRecord, pools: Mapping[str, BlockPool]) -> TurnRelease:
    """Give back a turn's refs; pages nobody else holds become evictable (the LRU's)."""
    released: dict[str, tuple[int, ...]] = {}
    evictable: dict[str, tuple[int, ...]] = {}
    for name, pages in turn.pages.items():
        pool = pools[name]
        released[name] = tuple(page for page in pages if page is not None)
        # NOTE: tail first, so the LRU evicts a prefix from its end and its shared head lasts.
        for page in reversed(released[name]):
            pool.release(page)
        evictable[name] = tuple(page for page in released[name] if pool.is_evictable(page))
    return TurnRelease(turn.conversation_id, turn.request_id, released, evictable)
