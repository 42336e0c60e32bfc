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
    device=st.integers(2000, 40000),
    lower=st.integers(0, 60000),
)
# The device's whole pages tip a 50/50 split by one page (1001 / 1000), scaled up threefold.
@example(
    step=TypicalStep(1, 8192, 2048, retained_turns=1, checkpoint=True,
                     full_tokens_per_retained_turn=8192),
    window=4096, with_state=False, device=2001, lower=6003,
)  # fmt: skip
def test_a_lower_tier_gives_the_full_pool_at_least_the_device_share(
    step, window, with_state, device, lower
):
    """If this fails, a host or disk tier keeps pages for resident sliding windows and every
    retained turn's endpoints, which it never holds, out of the full pool (the host tier
    copied the device split): its full share must be at least the device's, within
    `lower`, and a returning conversation's whole context gets its proportion."""
    cycles = life_cycles(window, with_state)
    device_pages = plan_pools(step, cycles, BLOCK, device).pool_pages
    tier = plan_lower_tier(step, cycles, BLOCK, lower)
    assert sum(tier.values()) <= lower
    if lower == 0:
        assert not any(tier.values())
        return
    held = lower_tier_demand(step, cycles, BLOCK)
    assert held["full"] == -(-step.max_context_tokens // BLOCK)
    # Within rounding: the device's split is in whole pages too, so its full share may be one
    # page over its proportion.
    device_share = (device_pages["full"] - 1) / sum(device_pages.values())
    assert tier["full"] >= int(lower * device_share) - 1


def test_a_lower_tier_by_bytes_weighs_each_page_by_its_bytes():
    """A state page of 40 attention pages' bytes: the bytes split weighs it so, whole pages."""
    cycles = life_cycles(4096, with_state=True)
    step = TypicalStep(4, 131072, 8192, retained_turns=20, full_tokens_per_retained_turn=26214)
    cost = {"full": 1, "swa": 1, "ssm": 40}
    budget = 100_000
    pages = plan_lower_tier(step, cycles, BLOCK, budget, cost)
    held = lower_tier_demand(step, cycles, BLOCK)  # full 2048, swa 2 x 64, ssm 1 + 1 + 1
    assert held == {"full": 2048, "swa": 128, "ssm": 3}
    weight = 2048 + 128 + 3 * 40
    assert pages == {
        "full": budget * 2048 // weight,
        "swa": budget * 128 // weight,
        "ssm": budget * 120 // weight // 40,
    }
