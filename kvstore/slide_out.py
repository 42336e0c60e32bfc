"""Commit planning and slide-out release of one request's window and state pages.

The manager owns every `RequestState` and pool; these helpers change only the state and pools
it hands them, on its behalf (the manager stays the single writer).

Which window/state blocks a request commits and keeps until its context ends:

| blocks                                   | committed | kept until context end |
|------------------------------------------|-----------|------------------------|
| endpoint window (prompt end)             | yes       | yes                    |
| checkpoint window (C, when planned)      | yes       | yes                    |
| branch-point windows and snapshots (b)   | yes       | yes                    |
| state snapshots at offsets from the end  | yes       | yes                    |
| periodic state snapshots                 | yes       | no                     |
| whole-prefix (full) life cycles          | all       | never slide            |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .block_pool import NULL_PAGE, BlockPool
from .branch_points import branch_positions
from .config import KVStoreConfig
from .life_cycles import LifeCycle
from .request_state import RequestState


def planned_checkpoint(
    config: KVStoreConfig, prompt_len: int, num_reused_tokens: int
) -> int | None:
    """The context-end checkpoint a prompt plans after reusing `num_reused_tokens`, or None
    (the policy allows none, checkpoints are off, or the reused prefix is already past it)."""
    checkpoint = config.checkpoint_position(prompt_len)
    enabled = config.reuse_policy.allows_checkpoint and config.checkpoint
    return checkpoint if enabled and checkpoint > num_reused_tokens else None


class CommitPlan(NamedTuple):
    """A request's checkpoint and branch points, and per life cycle its commit and keep sets."""

    checkpoint_tokens: int | None
    branch_tokens: tuple[int, ...]
    commit_blocks: dict[str, frozenset[int]]
    keep: dict[str, frozenset[int]]


def commit_plan(
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    prompt_len: int,
    num_reused_tokens: int,
    whole_prefix_tokens: int = 0,
    branch_hints: Sequence[int] = (),
) -> CommitPlan:
    """What a prompt of `prompt_len` tokens commits and keeps after reusing `num_reused_tokens`
    (`whole_prefix_tokens`: how far its whole-prefix life cycles found it cached;
    `branch_hints`: the request's, `branch_points.py`)."""
    bs = config.block_size
    checkpoint = planned_checkpoint(config, prompt_len, num_reused_tokens)
    branches = branch_positions(
        config, prompt_len, num_reused_tokens, whole_prefix_tokens, branch_hints
    )
    end_blocks = prompt_len // bs
    commit: dict[str, frozenset[int]] = {}
    keep: dict[str, frozenset[int]] = {}
    for name, life_cycle in life_cycles.items():
        # NOTE: whole-prefix life cycles commit every full block anyway and never slide.
        if life_cycle.needs_whole_prefix:
            keep[name] = commit[name] = frozenset()
            continue
        wanted = set(life_cycle.resume_blocks(end_blocks, bs))
        for position in (checkpoint, *branches) if checkpoint is not None else branches:
            wanted.update(life_cycle.resume_blocks(position // bs, bs))
        wanted.update(life_cycle.from_end_blocks(prompt_len, bs))
        keep[name] = frozenset(wanted)
        commit[name] = frozenset(wanted | life_cycle.snapshot_blocks(prompt_len, bs))
    return CommitPlan(checkpoint, branches, commit, keep)


def plan_commits(
    state: RequestState,
    life_cycles: Mapping[str, LifeCycle],
    config: KVStoreConfig,
    whole_prefix_tokens: int = 0,
) -> None:
    """At admission: set the request's checkpoint, branch points and window/state commit and
    keep sets (`commit_plan`)."""
    plan = commit_plan(
        life_cycles,
        config,
        state.prompt_len,
        state.num_reused_tokens,
        whole_prefix_tokens,
        state.branch_hints,
    )
    state.checkpoint_tokens, state.branch_tokens = plan.checkpoint_tokens, plan.branch_tokens
    state.commit_blocks, state.keep = plan.commit_blocks, plan.keep


def commit_computed(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    num_hashed: int,
    every_block: bool,
) -> None:
    """Commit the request's blocks below `num_hashed` not yet considered, per its commit sets."""
    hashes = state.sequence.hashes
    for name, life_cycle in life_cycles.items():
        if not life_cycle.reusable:
            continue
        pool, table = pools[name], state.page_tables[name]
        wanted = state.commit_blocks[name]
        for index in range(state.next_commit[name], num_hashed):
            if table[index] != NULL_PAGE and (
                every_block or life_cycle.needs_whole_prefix or index in wanted
            ):
                pool.commit(table[index], hashes[index])
        state.next_commit[name] = max(state.next_commit[name], num_hashed)


def release_slid_out(
    state: RequestState,
    pools: Mapping[str, BlockPool],
    life_cycles: Mapping[str, LifeCycle],
    block_size: int,
) -> None:
    """Release pages the running request no longer needs (kept ones wait for context end).

    Incremental: blocks below `next_release` were handled by an earlier call, so a decode
    commit costs the blocks that slid out since, not the whole context.
    """
    for name, life_cycle in life_cycles.items():
        first_live = life_cycle.first_live_block(state.num_computed_tokens, block_size)
        keep, table, pool = state.keep[name], state.page_tables[name], pools[name]
        for index in range(state.next_release[name], min(first_live, len(table))):
            if table[index] != NULL_PAGE and index not in keep:
                pool.release(table[index])
                table[index] = NULL_PAGE
        state.next_release[name] = max(state.next_release[name], first_live)


def release_kept(state: RequestState, pools: Mapping[str, BlockPool]) -> None:
    """At context end: release kept blocks that slid out meanwhile, and keep nothing more."""
    for name, kept in state.keep.items():
        table, pool = state.page_tables[name], pools[name]
        # NOTE: ascending, so the LRU order is that of one sweep over the page table.
        for index in sorted(kept):
            if index < state.next_release[name] and table[index] != NULL_PAGE:
                pool.release(table[index])
                table[index] = NULL_PAGE
        state.keep[name] = frozenset()


def release_tables(state: RequestState, pools: Mapping[str, BlockPool]) -> None:
    """At the request's end or cancel: release every page its page tables hold."""
    for name, table in state.page_tables.items():
        # NOTE: tail first, so the LRU evicts a prefix from its end and its shared head lasts.
        pools[name].release_all(reversed(table))
