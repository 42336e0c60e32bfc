"""The autoscaling decision on recorded metric series: hysteresis, cooldowns, bounds, drain."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvfleet.operator.autoscale import Drain, Policy, PoolState, Sample, decide

POLICY = Policy(
    min_replicas=1, max_replicas=6, window_seconds=60, scale_out_cooldown_seconds=120,
    scale_in_cooldown_seconds=300, drain_seconds=90, max_step=2,
)  # fmt: skip


def series(
    start: float, values: list[float], step: float = 10, signal: str = "deferrals_per_second"
):
    """Samples every `step` seconds from `start`, one signal set (deferral target: 0.5/s)."""
    return [Sample(at=start + i * step, **{signal: value}) for i, value in enumerate(values)]


def run(policy: Policy, state: PoolState, samples: list[Sample]):
    """Replay a recorded series, deciding at each sample's time; return the actions taken."""
    actions = []
    for index, sample in enumerate(samples):
        decision = decide(policy, state, samples[: index + 1], sample.at)
        state = decision.state
        actions.append(decision.action)
    return actions, state


def test_sustained_deferrals_scale_out():
    """Deferrals past the bound over target for a whole window must add ranks."""
    decision = decide(POLICY, PoolState(replicas=2), series(0, [1.0, 1.2, 1.1, 1.5]), now=30)
    assert decision.action == "scale_out"
    assert decision.state.replicas == 4  # pressure 2.0 -> double, capped by max_step=2


def test_one_spike_does_not_scale():
    """A single sample over target must not scale out (hysteresis needs the whole window)."""
    decision = decide(POLICY, PoolState(replicas=2), series(0, [0.3, 2.0, 0.3, 0.3]), now=30)
    assert decision.action == "hold"


def test_scale_out_respects_cooldown():
    """A second scale-out inside the cooldown must wait."""
    state = PoolState(replicas=3, last_scale_at=0)
    decision = decide(POLICY, state, series(30, [1.0, 1.0, 1.0]), now=50)
    assert decision.action == "hold"
    assert "cooldown" in decision.reason


def test_scale_out_stops_at_max():
    """No scale-out past maxReplicas."""
    decision = decide(POLICY, PoolState(replicas=6), series(0, [5.0, 5.0, 5.0]), now=20)
    assert (decision.action, decision.state.replicas) == ("hold", 6)


def test_below_min_is_raised_at_once():
    """A pool under minReplicas is raised to it without waiting for metrics."""
    decision = decide(POLICY, PoolState(replicas=0), [], now=0)
    assert (decision.action, decision.state.replicas) == ("scale_out", 1)


def test_oscillating_load_inside_band_never_flaps():
    """Load swinging between 0.6x and 0.95x target must produce no action at all."""
    values = [0.3, 0.475] * 30  # deferrals target 0.5/s: pressure 0.6 .. 0.95
    actions, state = run(POLICY, PoolState(replicas=3), series(0, values))
    assert set(actions) == {"hold"}
    assert state.replicas == 3


def test_scale_in_drains_before_removing_ranks():
    """Low load must first drain (replicas unchanged), then remove the rank after drain_seconds."""
    samples = series(1000, [0.05] * 30)
    actions, state = run(POLICY, PoolState(replicas=3), samples)
    first_drain = actions.index("begin_drain")
    finish = actions.index("finish_drain")
    assert actions[first_drain + 1 : finish] == ["hold"] * (finish - first_drain - 1)
    assert samples[finish].at - samples[first_drain].at >= POLICY.drain_seconds
    assert state.replicas == 2


def test_drain_keeps_replicas_until_done():
    """While draining, the decided replica count stays at the old size."""
    state = PoolState(replicas=3, drain=Drain(target_replicas=2, since=100))
    decision = decide(POLICY, state, series(100, [0.05] * 4), now=130)
    assert (decision.action, decision.state.replicas) == ("hold", 3)


def test_load_returning_cancels_drain():
    """Sustained pressure during a drain must cancel it instead of removing the rank."""
    state = PoolState(replicas=3, drain=Drain(target_replicas=2, since=100))
    decision = decide(POLICY, state, series(100, [2.0, 2.0, 2.0]), now=120)
    assert decision.action == "cancel_drain"
    assert decision.state == PoolState(replicas=3)


def test_scale_in_respects_cooldown_after_scale_out():
    """Right after a scale-out, low load must not start a drain."""
    state = PoolState(replicas=4, last_scale_at=1000)
    decision = decide(POLICY, state, series(1010, [0.0, 0.0, 0.0]), now=1030)
    assert decision.action == "hold"


def test_bad_policy_is_rejected_with_numbers():
    """min > max must be a ValueError naming both."""
    with pytest.raises(ValueError, match="min_replicas=5 <= max_replicas=2"):
        Policy(min_replicas=5, max_replicas=2)


@given(
    values=st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=60),
    replicas=st.integers(min_value=0, max_value=10),
)
def test_replicas_stay_within_bounds_and_change_by_bounded_steps(values, replicas):
    """Whatever the series, the decided size moves toward [min, max] and by at most max_step."""
    state = PoolState(replicas=replicas)
    for index, sample in enumerate(series(0, values)):
        before = state.replicas
        state = decide(POLICY, state, series(0, values)[: index + 1], sample.at).state
        if POLICY.min_replicas <= before <= POLICY.max_replicas:
            assert POLICY.min_replicas <= state.replicas <= POLICY.max_replicas
            assert abs(state.replicas - before) <= POLICY.max_step
        if state.drain is not None:
            assert state.drain.target_replicas < state.replicas
