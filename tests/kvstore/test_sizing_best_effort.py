"""Best-effort sizing: retained turns take only the pages a rank's residents leave over, and a
lower tier is split for what it holds (conversations between turns), not like the device."""

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.sizing import (
    TypicalStep,
    lower_tier_demand,
    peak_demand,
    plan_lower_tier,
    plan_pools,
)

BLOCK = 64


def life_cycles(window_tokens: int, with_state: bool):
    cycles = [FullLifeCycle("full"), WindowLifeCycle("swa", window_tokens, replay_tokens=64)]
    if with_state:
        cycles.append(StateLifeCycle("ssm", every_tokens=8192, offsets_from_end=(0, 2048)))
    return cycles


steps = st.builds(
    lambda slots, context, chunk, conversations, turns, checkpoint: TypicalStep(
        slots,
        context,
        chunk,
        retained_turns=conversations * turns,
        checkpoint=checkpoint,
        full_tokens_per_retained_turn=context // turns,
    ),
    slots=st.integers(1, 16),
    context=st.sampled_from([8192, 32768, 131072]),
    chunk=st.sampled_from([2048, 8192]),
    conversations=st.integers(1, 16),
    turns=st.integers(1, 6),
    checkpoint=st.booleans(),
)


def resident_pages(step: TypicalStep, cycles) -> int:
    return sum(peak_demand(replace(step, retained_turns=0), cycles, BLOCK).values())


@settings(max_examples=200, deadline=None)
@given(
    step=steps,
    window=st.sampled_from([1024, 4096]),
    with_state=st.booleans(),
    share=st.floats(0.05, 1.0),
)
def test_retention_takes_no_pages_the_residents_need(step, window, with_state, share):
    """If this fails, a rank whose residents at their peak fill it (or more) splits its pages
    for retained turns it cannot hold, taking from the full pool what plain LRU keeps there:
    the split must equal the split of a rank that retains nothing."""
    cycles = life_cycles(window, with_state)
    total = max(2 * len(cycles), int(resident_pages(step, cycles) * share))
    retaining = plan_pools(step, cycles, BLOCK, total).pool_pages
    lru = plan_pools(replace(step, retained_turns=0), cycles, BLOCK, total).pool_pages
    assert retaining == lru
    assert sum(retaining.values()) <= total


@settings(max_examples=200, deadline=None)
@given(
    step=steps,
    window=st.sampled_from([1024, 4096]),
    with_state=st.booleans(),
    lower=st.integers(0, 60000),
)
@example(
    step=TypicalStep(1, 8192, 2048, retained_turns=1, checkpoint=True,
                     full_tokens_per_retained_turn=8192),
    window=4096, with_state=False, lower=6003,
)  # fmt: skip
def test_a_lower_tier_is_split_for_one_conversation_between_turns(step, window, with_state, lower):
    """If this fails, a host or disk tier is split like the device (resident sliding windows
    and every retained turn's endpoints, which it never holds, taken from the full pool), or
    weighs a conversation at the longest context, starving its window pool: the split must
    follow one conversation between turns at half the longest context, one endpoint (and
    checkpoint) window, whatever the rank's slots and retained turns."""
    cycles = life_cycles(window, with_state)
    tier = plan_lower_tier(step, cycles, BLOCK, lower)
    assert sum(tier.values()) <= lower
    if lower == 0:
        assert not any(tier.values())
        return
    held = lower_tier_demand(step, cycles, BLOCK)
    assert held["full"] == -(-(step.max_context_tokens // 2) // BLOCK)
    assert held["swa"] == (1 + step.checkpoint) * -(-window // BLOCK)
    alone = TypicalStep(1, step.max_context_tokens, step.chunk_tokens, checkpoint=step.checkpoint)
    assert tier == plan_lower_tier(alone, cycles, BLOCK, lower)


def test_a_lower_tier_by_bytes_weighs_each_page_by_its_bytes():
    """A state page of 40 attention pages' bytes: the bytes split weighs it so, whole pages."""
    cycles = life_cycles(4096, with_state=True)
    step = TypicalStep(4, 131072, 8192, retained_turns=20, full_tokens_per_retained_turn=26214)
    cost = {"full": 1, "swa": 1, "ssm": 40}
    budget = 100_000
    pages = plan_lower_tier(step, cycles, BLOCK, budget, cost)
    held = lower_tier_demand(step, cycles, BLOCK)  # full 1024 (half), swa 2 x 64, ssm 1 + 1 + 1
    assert held == {"full": 1024, "swa": 128, "ssm": 3}
    weight = 1024 + 128 + 3 * 40
    assert pages == {
        "full": budget * 1024 // weight,
        "swa": budget * 128 // weight,
        "ssm": budget * 120 // weight // 40,
    }
