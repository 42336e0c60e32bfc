"""Pool sizing: split a tier between pools in proportion to a typical step's live pages.

A tier is pages (`plan_pools`: every page alike) or bytes (`plan_pool_bytes`: each pool's pages
have their own size, and a pool's bytes follow its peak pages x its page bytes; an SSM state
snapshot can take as many bytes as tens of attention pages).

A typical step holds the resident requests' pages plus what retained turns keep (endpoints,
checkpoints, state snapshots). Each count below is a peak (an upper bound on pages with a ref
count above zero), so a tier sized at the sum never runs out at that step. B is the block size,
L the longest context, c the chunk, w the window; "ckpt" counts only when checkpoints are on,
"br" is the branch-point windows a resident request keeps until its context ends (one with
branch points, 0 without: a second hinted point's window adds only the distance between the
hints, the system prompt's length, under a window in Claude Code sessions, and counting two
in the floor cost a point of reuse on the tuning half's memory-short fleet). Branch records
count among the retained turns (`policy.retained_turns`), but each holds one window and one
snapshot, not a turn's two, and its full blocks are a prefix of its conversation's context,
which the turns already count.

| kind    | per resident request                          | per retained turn | per branch record |
|---------|-----------------------------------------------|-------------------|-------------------|
| full    | ceil(L/B)                                     | ceil(L/B) (*)     | 0                 |
| window  | min(ceil(L/B), ceil((w+c)/B)+1 + (ckpt+br)*W) | (1 + ckpt) * W    | W                 |
| private | ceil(L/B)                                     | 0                 | 0                 |
| state   | 3 + S + ckpt + br + E                         | 1 + ckpt + E      | 1                 |

W = ceil(w/B). A state page table has pages only where a state is stored (`paged_blocks`), so a
resident request holds the page its chunk resumes from, the page of its last token (the
running state), its endpoint snapshot, and S = the periodic snapshots one chunk passes
(min(ceil(c/e), ceil(c/B) + 1) for a period of e tokens, 0 without one): never the chunk's
other blocks. Under a policy that commits every block (`every_block_snapshots`) every block is
a snapshot: S = ceil(c/B) + 1. E = the state life cycle's from-end offsets besides 0: a resident
request keeps each from-end snapshot until its context ends, and every retained turn keeps its
own (a from-end boundary moves with the prompt, so turns never share them). Periodic snapshots
behind the running state are left to the LRU and counted nowhere: they are evictable, so
conversions of pages to tokens count live ones.
(*) no sharing, unless `full_tokens_per_retained_turn` says what each holds.

The split weighs the peak without branch windows (`_weighed_step` says why); the floor below
counts a resident's. Under pressure (fewer pages than the peak) the split is lifted to a
floor: what one conversation alone needs, a request at L next to its previous turn's whole
prefix (a turn that rewrites its prompt recomputes what the retained turn still holds).
Window and state pools get their floor first (it does not grow with L); the full and private
pools then share the rest up to theirs. Without it, a rank sized for several conversations'
retained windows cannot keep even one long conversation's prefix.

Retention is best-effort (`held_step`): the split weighs only the retained turns the tier holds
next to its residents at their peak, so a rank whose residents fill it splits like one that
retains nothing (an LRU rank). A lower tier (host, disk) holds no resident request, only
conversations between turns: `plan_lower_tier` splits it by one conversation's context (at half
the longest) and its latest endpoint per life cycle, not like the device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, cast

from .life_cycles import LifeCycle, StateLifeCycle, WindowLifeCycle

if TYPE_CHECKING:
    from .policies import ReusePolicy


@dataclass(frozen=True)
class TypicalStep:
    """What a rank holds at its peak: resident requests and retained turn endpoints.

    `branch_points`: the branch-point windows counted per resident request (one when the
    policy keeps branch points; a turn plans at most `keep_branch_points`). `branch_records`:
    how many of `retained_turns` are branch records.
    `retained_snapshots` False leaves the retained turns' from-end snapshots out of the plan
    (what sizing did before they were retained: a baseline for measuring their effect).
    `every_block_snapshots`: the reuse policy commits every block (every state is a snapshot).
    """

    num_slots: int
    max_context_tokens: int
    chunk_tokens: int
    retained_turns: int = 0
    checkpoint: bool = True
    full_tokens_per_retained_turn: int | None = None
    branch_points: int = 0
    branch_records: int = 0
    retained_snapshots: bool = True
    every_block_snapshots: bool = False

    def __post_init__(self) -> None:
        if self.num_slots < 1 or self.max_context_tokens < 1 or self.chunk_tokens < 1:
            raise ValueError(
                f"num_slots, max_context_tokens, chunk_tokens must be >= 1, got {self.num_slots}, "
                f"{self.max_context_tokens}, {self.chunk_tokens}"
            )
        if self.retained_turns < 0:
            raise ValueError(f"retained_turns must be >= 0, got {self.retained_turns}")
        if not 0 <= self.branch_records <= self.retained_turns:
            raise ValueError(
                f"need 0 <= branch_records <= retained_turns, got {self.branch_records} and "
                f"{self.retained_turns}"
            )


def rank_typical_step(
    num_slots: int,
    max_context_tokens: int,
    chunk_tokens: int,
    retained_conversations: int,
    policy: ReusePolicy,
    checkpoint: bool = True,
    retained_snapshots: bool = True,
) -> TypicalStep:
    """The step a rank's pools are sized for (the engine and the simulator both call this):
    every slot resident at the longest context, plus the retained turns of
    `retained_conversations` conversations between turns (none when the policy retains none;
    root and branch records count among the turns, and residents then keep a branch window).

    NOTE: a conversation's retained turns share its full-attention prefix, so each turn counts
    1/turns of the longest context on whole-prefix pools (a conversation's turns together hold
    one context; its branch records hold prefixes of it), and its own endpoint (and checkpoint)
    windows on window pools.
    """
    turns = policy.retained_turns
    branches = int(policy.keep_branch_points)
    return TypicalStep(
        num_slots=num_slots,
        max_context_tokens=max_context_tokens,
        chunk_tokens=chunk_tokens,
        retained_turns=retained_conversations * turns,
        checkpoint=checkpoint,
        full_tokens_per_retained_turn=max_context_tokens // max(1, turns - branches),
        branch_points=min(branches, 1),
        branch_records=retained_conversations * branches,
        retained_snapshots=retained_snapshots,
        every_block_snapshots=policy.commits_every_block,
    )


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Peak(NamedTuple):
    """Peak pages of one life cycle per resident request, retained turn and branch record."""

    resident: int
    retained_turn: int
    branch_record: int


def _full(lc: LifeCycle, step: TypicalStep, bs: int) -> Peak:
    retained = _blocks(step.full_tokens_per_retained_turn or step.max_context_tokens, bs)
    return Peak(_blocks(step.max_context_tokens, bs), retained, 0)


def _window(lc: LifeCycle, step: TypicalStep, bs: int) -> Peak:
    window_tokens = cast(WindowLifeCycle, lc).window_tokens  # PEAK_PAGES picks it by kind
    window_blocks = _blocks(window_tokens, bs)
    sliding = _blocks(window_tokens + step.chunk_tokens, bs) + 1
    kept = (step.checkpoint + step.branch_points) * window_blocks
    resident = min(_blocks(step.max_context_tokens, bs), sliding + kept)
    return Peak(resident, (1 + step.checkpoint) * window_blocks, window_blocks)


def _private(lc: LifeCycle, step: TypicalStep, bs: int) -> Peak:
    return Peak(_blocks(step.max_context_tokens, bs), 0, 0)


def _state(lc: LifeCycle, step: TypicalStep, bs: int) -> Peak:
    state = cast(StateLifeCycle, lc)  # PEAK_PAGES maps only "state" here
    from_end = state.num_extra_from_end
    spanned = _blocks(step.chunk_tokens, bs) + 1  # blocks one chunk touches, at most
    periodic = _blocks(step.chunk_tokens, state.every_tokens) if state.every_tokens else 0
    passed = spanned if step.every_block_snapshots else min(periodic, spanned)
    resident = 3 + passed + step.checkpoint + step.branch_points
    retained = 1 + step.checkpoint + from_end * step.retained_snapshots
    return Peak(resident + from_end, retained, 1)


# Kinds whose peak per request grows with the context (the others are bounded by a window).
CONTEXT_SIZED_KINDS = frozenset({"full", "private"})

PEAK_PAGES: dict[str, Callable[[LifeCycle, TypicalStep, int], Peak]] = {
    "full": _full,
    "window": _window,
    "private": _private,
    "state": _state,
}


@dataclass(frozen=True)
class PoolPlan:
    """Peak live pages per life cycle and the pages (null page included) each pool gets."""

    demand: Mapping[str, int]
    pool_pages: Mapping[str, int]


def peak_demand(
    step: TypicalStep, life_cycles: Sequence[LifeCycle], block_size: int
) -> dict[str, int]:
    """Peak live pages per life cycle for `step`."""
    demand = {}
    for life_cycle in life_cycles:
        peak = PEAK_PAGES[life_cycle.kind](life_cycle, step, block_size)
        turns = step.retained_turns - step.branch_records
        demand[life_cycle.name] = (
            step.num_slots * peak.resident
            + turns * peak.retained_turn
            + step.branch_records * peak.branch_record
        )
    return demand


def plan_pools(
    step: TypicalStep,
    life_cycles: Sequence[LifeCycle],
    block_size: int,
    total_pages: int | None = None,
) -> PoolPlan:
    """Split `total_pages` in proportion to the peak (default: exactly the peak, null pages too).

    Every page counts alike here; `plan_pool_bytes` splits bytes when pages differ in size."""
    demand = peak_demand(step, life_cycles, block_size)
    if total_pages is None:
        return PoolPlan(demand, {name: need + 1 for name, need in demand.items()})
    return _plan_within(step, life_cycles, block_size, total_pages, dict.fromkeys(demand, 1))


def plan_pool_bytes(
    step: TypicalStep,
    life_cycles: Sequence[LifeCycle],
    block_size: int,
    budget_bytes: int,
    page_bytes: Mapping[str, int],
) -> PoolPlan:
    """Split a rank's `budget_bytes` between pools whose pages take `page_bytes[name]` each:
    each pool's bytes in proportion to its peak's bytes (peak pages x page bytes), lifted to
    the floor of one conversation alone, then as many whole pages as they buy.

    NOTE: an SSM state snapshot can take tens of attention pages' bytes, so a split by page
    count gives the state pool far too few bytes under pressure, or far too many pages when
    pages stand for bytes; only bytes say which pool runs out first.
    """
    demand = peak_demand(step, life_cycles, block_size)
    missing = set(demand) - set(page_bytes)
    if missing or any(page_bytes[name] < 1 for name in demand):
        raise ValueError(f"page_bytes {dict(page_bytes)} must give every pool of {sorted(demand)}")
    return _plan_within(step, life_cycles, block_size, budget_bytes, page_bytes)


def _plan_within(
    step: TypicalStep,
    life_cycles: Sequence[LifeCycle],
    block_size: int,
    budget: int,
    cost: Mapping[str, int],
) -> PoolPlan:
    """`budget` units split in proportion to each pool's peak units (pages x `cost`, a page's
    units) without branch windows (`_weighed_step`), lifted to the lone floors; whole pages per
    pool."""
    demand = peak_demand(step, life_cycles, block_size)
    if budget < sum(2 * cost[name] for name in demand):
        raise ValueError(
            f"a budget of {budget} cannot make {len(demand)} pools of >= 2 pages "
            f"(page sizes {dict(cost)})"
        )
    weighed_step = held_step(_weighed_step(step), life_cycles, block_size, budget, cost)
    weighed = peak_demand(weighed_step, life_cycles, block_size)
    weights = {name: need * cost[name] for name, need in weighed.items()}
    units = _split(budget, weights, {name: 2 * cost[name] for name in demand})
    pages = {name: units[name] // cost[name] for name in demand}
    floors = lone_floors(step, life_cycles, block_size, budget, cost)
    return PoolPlan(demand, _raise_to_floors(pages, floors, cost))


def _weighed_step(step: TypicalStep) -> TypicalStep:
    """The step a proportional split weighs: without branch windows (residents' and records').

    NOTE: the peak counts each retained turn's windows as if no two turns shared a page, but a
    conversation's consecutive endpoints overlap, and that slack holds its branch windows.
    Weighed in, they took ~4 % of the full pool of an 8-slot rank and cost 8 % of the
    prefill-bound load shape's throughput; the lone floor still counts a resident's branch
    window, without which a pool split at the floor churned its windows (docs/simulator.md).
    """
    if not step.branch_points and not step.branch_records:
        return step
    turns = step.retained_turns - step.branch_records
    return replace(step, branch_points=0, branch_records=0, retained_turns=turns)


def held_step(
    step: TypicalStep,
    life_cycles: Sequence[LifeCycle],
    block_size: int,
    budget: int,
    cost: Mapping[str, int] | None = None,
) -> TypicalStep:
    """`step` with only the retained turns that `budget` holds next to its resident requests
    at their peak: retention is best-effort, so the split weighs a retained turn only where
    the pages it takes are left over by the residents (which an LRU would give to them).

    NOTE: weighed in full, 8 retained conversations took a fifth of an 8-slot rank's pages for
    their windows while 8 residents at the longest context already needed more than the whole
    rank: the full pool then kept nothing between turns, and retention reused less than plain
    LRU (docs/simulator.md, "Best-effort retention").
    """
    turns = step.retained_turns - step.branch_records
    if not turns:
        return step
    unit = cost or {lc.name: 1 for lc in life_cycles}
    resident = turn = 0
    for lc in life_cycles:
        peak = PEAK_PAGES[lc.kind](lc, step, block_size)
        resident += step.num_slots * peak.resident * unit[lc.name]
        turn += peak.retained_turn * unit[lc.name]
    held = min(turns, max(0, budget - resident) // max(1, turn))
    if held == turns:
        return step
    return replace(step, retained_turns=held + step.branch_records)


def _split(
    total: int, weights: Mapping[str, int], minimum: Mapping[str, int] | None = None
) -> dict[str, int]:
    """`total` in proportion to `weights` (each at least its `minimum`, default 2), the
    rounding to the largest."""
    weight = sum(weights.values()) or 1
    least = minimum or dict.fromkeys(weights, 2)
    units = {name: max(least[name], total * need // weight) for name, need in weights.items()}
    largest = max(weights, key=weights.__getitem__)
    units[largest] += total - sum(units.values())
    return units


def lone_floors(
    step: TypicalStep,
    life_cycles: Sequence[LifeCycle],
    block_size: int,
    total: int,
    cost: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The pages (null page included) each pool needs for one conversation alone on the rank:
    one request at the longest context next to its previous turn's whole prefix (a turn that
    rewrites its prompt recomputes a prefix the previous one still holds), as far as `total`
    goes (units of `cost` per page: bytes, or 1 each by default); none (2 each) when it cannot
    hold even that request alone, except one resident's pages on the bounded pools.

    Pools whose peak does not grow with the context (window, state) get theirs first: they
    are small, and a proportional split under pressure would otherwise starve the pools that
    hold the prefix itself.
    """
    lone = TypicalStep(
        1,
        step.max_context_tokens,
        step.chunk_tokens,
        1,
        step.checkpoint,
        branch_points=step.branch_points,
    )
    need = {name: pages + 1 for name, pages in peak_demand(lone, life_cycles, block_size).items()}
    unit = cost or dict.fromkeys(need, 1)
    growing = [lc.name for lc in life_cycles if lc.kind in CONTEXT_SIZED_KINDS]
    bounded = [name for name in need if name not in growing]
    floors = {name: 2 for name in need}
    alone = peak_demand(replace(lone, retained_turns=0), life_cycles, block_size)
    lone_units = sum(need[n] * unit[n] for n in bounded) + sum(
        (alone[n] + 1) * unit[n] for n in growing
    )
    room = total - sum(2 * unit[name] for name in need)
    if total < lone_units:
        # Not even one request at the longest context fits, but a shorter one does if the
        # bounded pools hold one resident's pages (its sliding window): those first.
        for name in bounded:
            floors[name] += max(0, min(room // unit[name], alone[name] + 1 - 2))
            room -= (floors[name] - 2) * unit[name]
        return floors
    for name in bounded:
        floors[name] += min(room // unit[name], max(0, need[name] - 2))
        room -= (floors[name] - 2) * unit[name]
    wanted = {name: max(0, need[name] - 2) * unit[name] for name in growing}
    if room >= sum(wanted.values()):
        for name in growing:
            floors[name] += wanted[name] // unit[name]
    elif growing and room > 0:
        least = {name: 2 * unit[name] for name in growing}
        for name, extra in _split(room + sum(least.values()), wanted, least).items():
            floors[name] = extra // unit[name]
    return floors


def _raise_to_floors(
    pages: dict[str, int], floors: Mapping[str, int], cost: Mapping[str, int]
) -> dict[str, int]:
    """Lift pools below their floor; pools above theirs give the units up in proportion to
    what they hold above it (whole pages, rounded up). The total stays within the budget (the
    floors add up to at most it)."""
    short = sum(max(0, floors[name] - have) * cost[name] for name, have in pages.items())
    if not short:
        return pages
    slack = {
        name: (have - floors[name]) * cost[name]
        for name, have in pages.items()
        if have > floors[name]
    }
    given = _split_exact(short, slack)
    return {
        name: max(floors[name], have - -(-given.get(name, 0) // cost[name]))
        for name, have in pages.items()
    }


def _split_exact(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """`total` in proportion to `weights`, each share at most its weight, summing to `total`."""
    weight = sum(weights.values())
    shares = {name: total * slack // weight for name, slack in weights.items()}
    for name in sorted(weights, key=lambda n: weights[n] - shares[n], reverse=True):
        if sum(shares.values()) == total:
            break
        if shares[name] < weights[name]:
            shares[name] += 1
    return shares


def lower_tier_demand(
    step: TypicalStep, life_cycles: Sequence[LifeCycle], block_size: int
) -> dict[str, int]:
    """Pages per life cycle of one conversation as a lower tier (host, disk) holds it.

    A lower tier holds no resident request: it holds what the device let go, conversations
    between turns, and a returning turn resumes at its conversation's latest endpoint. So per
    conversation: its context on pools whose peak grows with it (full), one turn's endpoint
    and checkpoint on the bounded ones (window, state), nothing private. The context counts at
    half the longest: a conversation's prompt grows from nothing towards the longest over its
    life, so the conversations a tier holds between turns are, on average, half as long,
    while each holds a whole endpoint window whatever its length.

    NOTE: copying the device split instead gives a lower tier the device's resident sliding
    windows and every retained turn's endpoints; on the load shape's host tier that was ~10 %
    of the full-attention pages across both tiers. Counting the longest context instead of
    half of it starved the window pool: on the load shape's tuning half, conversations whose
    full blocks the host still held lost their endpoint windows (docs/simulator.md).
    """
    whole = replace(step, full_tokens_per_retained_turn=max(1, step.max_context_tokens // 2))
    return {lc.name: PEAK_PAGES[lc.kind](lc, whole, block_size).retained_turn for lc in life_cycles}


def plan_lower_tier(
    step: TypicalStep,
    life_cycles: Sequence[LifeCycle],
    block_size: int,
    budget: int,
    page_cost: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """A lower tier's `budget` (pages, or bytes with `page_cost` per page) split between life
    cycles in proportion to one conversation's pages there (`lower_tier_demand`) x their
    cost; whole pages, 0 everywhere for a budget of 0."""
    demand = lower_tier_demand(step, life_cycles, block_size)
    cost = page_cost or dict.fromkeys(demand, 1)
    if budget <= 0:
        return dict.fromkeys(demand, 0)
    weights = {name: pages * cost[name] for name, pages in demand.items()}
    if not any(weights.values()):
        weights = dict(cost)
    total = sum(weights.values())
    return {name: budget * weights[name] // total // cost[name] for name in demand}
