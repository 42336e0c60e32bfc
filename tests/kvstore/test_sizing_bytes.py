"""Byte budgets: a rank's KV bytes split between pools whose pages differ in size.

The tight scenario gives a rank exactly the bytes of its plan (test_sizing's workload, one slot
and six conversations, an SSM state page of eight attention pages' bytes): counting the retained
turns' from-end snapshots, every pool holds its peak; leaving them out, the state pool is the one
that runs out. The larger the state page, the more of the bytes the unsized plan leaves out flow
back to the state pool itself (it holds most of them), so the shortfall shrinks.
"""

from dataclasses import replace

import pytest
from kv_factories import make_manager
from kvfleet.kvstore.policies import PerConversation
from kvfleet.kvstore.sizing import TypicalStep, plan_pool_bytes, plan_pools
from test_sizing import BLOCK, KEEP, LIFE_CYCLES, MARGIN, drive_to_peak, step_for

# An SSM state snapshot as large as eight attention pages.
PAGE_BYTES = {"full": 1024, "swa": 1024, "ssm": 8 * 1024, "scratch": 1024}
NUM_SLOTS, CONVERSATIONS = 1, 6


def peak_bytes(step: TypicalStep, page_bytes: dict[str, int] = PAGE_BYTES) -> int:
    """The bytes of `step`'s exact plan (its peak pages and a null page per pool)."""
    pages = plan_pools(step, LIFE_CYCLES, BLOCK).pool_pages
    return sum(count * page_bytes[name] for name, count in pages.items())


def live_peak(pool_pages: dict[str, int]) -> dict[str, int]:
    """The most live pages per pool of the workload, run on a manager with `pool_pages`."""
    manager = make_manager(
        LIFE_CYCLES, pool_pages, BLOCK, PerConversation(KEEP), checkpoint_margin_tokens=MARGIN
    )
    peak = drive_to_peak(manager, NUM_SLOTS, CONVERSATIONS)
    manager.check_integrity()
    return peak


def test_with_retained_snapshots_counted_every_pool_holds_its_peak():
    """The plan within its own bytes runs the workload, and the unsized plan at the same bytes
    leaves the state pool short while every other pool has room: it runs out first."""
    sized = step_for(NUM_SLOTS, CONVERSATIONS * KEEP)
    budget = peak_bytes(sized)
    pages = dict(plan_pool_bytes(sized, LIFE_CYCLES, BLOCK, budget, PAGE_BYTES).pool_pages)
    assert sum(count * PAGE_BYTES[name] for name, count in pages.items()) <= budget
    peak = live_peak(pages)  # fails inside if any pool cannot take a step's pages
    for name, live in peak.items():
        assert live + 1 <= pages[name], (name, live, pages[name])
    unsized = replace(sized, retained_snapshots=False)
    short = plan_pool_bytes(unsized, LIFE_CYCLES, BLOCK, budget, PAGE_BYTES).pool_pages
    assert short["ssm"] < peak["ssm"] + 1, (short["ssm"], peak["ssm"])
    for name in ("full", "swa", "scratch"):
        assert short[name] >= peak[name] + 1, (name, short[name], peak[name])


def test_bytes_split_in_proportion_to_peak_bytes():
    """Each pool's bytes follow its peak pages x page bytes, not its page count."""
    step = TypicalStep(num_slots=2, max_context_tokens=256, chunk_tokens=32, retained_turns=4)
    budget = 4 * peak_bytes(step)
    plan = plan_pool_bytes(step, LIFE_CYCLES, BLOCK, budget, PAGE_BYTES)
    weights = {name: need * PAGE_BYTES[name] for name, need in plan.demand.items()}
    for name, pages in plan.pool_pages.items():
        share = budget * weights[name] / sum(weights.values())
        assert abs(pages * PAGE_BYTES[name] - share) <= PAGE_BYTES[name] + max(PAGE_BYTES.values())
    # NOTE: the same pages in total split by count alike: the proportions are the peak's
    # either way; bytes decide how many pages there are and where the floors bind.


def test_the_larger_the_state_page_the_smaller_the_unsized_shortfall():
    """Left-out snapshot bytes go mostly back to the pool that holds most bytes: the unsized
    plan's state pages come closer to the sized plan's as a state page grows."""
    sized = step_for(NUM_SLOTS, CONVERSATIONS * KEEP)
    unsized = replace(sized, retained_snapshots=False)
    shortfalls = []
    for ratio in (1, 8, 40):
        page_bytes = {**PAGE_BYTES, "ssm": ratio * 1024}
        budget = peak_bytes(sized, page_bytes)
        plans = (
            plan_pool_bytes(step, LIFE_CYCLES, BLOCK, budget, page_bytes)
            for step in (sized, unsized)
        )
        right, short = (plan.pool_pages["ssm"] for plan in plans)
        shortfalls.append(right - short)
    assert shortfalls[0] > shortfalls[1] > shortfalls[2] >= 0, shortfalls


def test_equal_page_bytes_split_like_page_counts():
    """With every page one unit, the byte split is the page split."""
    step = step_for(NUM_SLOTS, CONVERSATIONS * KEEP)
    for total in (60, 400, 5000):
        ones = dict.fromkeys(PAGE_BYTES, 1)
        assert plan_pool_bytes(step, LIFE_CYCLES, BLOCK, total, ones).pool_pages == (
            plan_pools(step, LIFE_CYCLES, BLOCK, total).pool_pages
        )


def test_a_budget_below_two_pages_per_pool_is_refused():
    """Too few bytes for any pool says how many it got and the page sizes."""
    step = step_for(1, 0)
    with pytest.raises(ValueError, match="cannot make 4 pools"):
        plan_pool_bytes(step, LIFE_CYCLES, BLOCK, 2 * 8 * 1024, PAGE_BYTES)
