"""The autoscaling decision for one pool: a pure function of policy, state, metrics and time.

Hysteresis: scale out only when every sample of the window is over target (pressure > 1),
scale in only when every sample is under `scale_in_below`; the band between holds. Cooldowns
since the last change stop flapping. Scale-in never cuts a rank at once: it first drains the
leaving ranks (the router stops pinning new conversations to them, their retained prefixes stay
reachable through the shared disk tier) and lowers replicas only after `drain_seconds`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

# Fewer samples than this in the window is not a trend: hold.
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Sample:
    """One reading of a pool's load signals at time `at` (seconds)."""

    at: float
    queue_depth_per_rank: float = 0.0
    deferrals_per_second: float = 0.0
    ttft_p90_seconds: float = 0.0
    kv_usage: float = 0.0
    retained_working_set: float = 0.0


@dataclass(frozen=True)
class Targets:
    """The value of each signal at which a pool counts as full."""

    queue_depth_per_rank: float = 4.0
    deferrals_per_second: float = 0.5
    ttft_p90_seconds: float = 2.0
    kv_usage: float = 0.9
    retained_working_set: float = 0.8


# The signals the decision weighs, by name: each is compared with the target of the same name.
SIGNALS: tuple[str, ...] = (
    "queue_depth_per_rank",
    "deferrals_per_second",
    "ttft_p90_seconds",
    "kv_usage",
    "retained_working_set",
)


@dataclass(frozen=True)
class Policy:
    """Bounds, targets and timing of one pool's autoscaling."""

    min_replicas: int
    max_replicas: int
    targets: Targets = Targets()
    window_seconds: float = 120.0
    scale_in_below: float = 0.5
    scale_out_cooldown_seconds: float = 180.0
    scale_in_cooldown_seconds: float = 600.0
    drain_seconds: float = 120.0
    max_step: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 0 <= min_replicas={self.min_replicas} <= max_replicas={self.max_replicas}"
            )
        if not 0.0 < self.scale_in_below < 1.0:
            raise ValueError(f"scale_in_below={self.scale_in_below} must be in (0, 1)")


@dataclass(frozen=True)
class Drain:
    """A scale-in under way: ranks at ordinals >= target_replicas are leaving since `since`."""

    target_replicas: int
    since: float


@dataclass(frozen=True)
class PoolState:
    """What the operator remembers of a pool between decisions."""

    replicas: int
    last_scale_at: float | None = None
    drain: Drain | None = None


Action = Literal["hold", "scale_out", "begin_drain", "finish_drain", "cancel_drain"]


@dataclass(frozen=True)
class Decision:
    """What to do now, the state to remember afterwards, and why (recorded in status and Events)."""

    action: Action
    state: PoolState
    reason: str


def pressure(sample: Sample, targets: Targets) -> float:
    """The most loaded signal of a sample as a fraction of its target (1.0 = exactly full)."""
    return max(getattr(sample, name) / getattr(targets, name) for name in SIGNALS)


def decide(policy: Policy, state: PoolState, samples: Sequence[Sample], now: float) -> Decision:
    """Decide one pool's next step from the samples of the last `window_seconds`."""
    window = [sample for sample in samples if now - policy.window_seconds <= sample.at <= now]
    pressures = [pressure(sample, policy.targets) for sample in window]
    sustained_high = len(pressures) >= MIN_SAMPLES and min(pressures) > 1.0
    sustained_low = len(pressures) >= MIN_SAMPLES and max(pressures) < policy.scale_in_below
    if state.drain is not None:
        return _continue_drain(policy, state, sustained_high, now)
    if state.replicas < policy.min_replicas:
        return _scale_to(
            state, policy.min_replicas, now, f"below minReplicas={policy.min_replicas}"
        )
    if state.replicas > policy.max_replicas:
        return _begin_drain(
            state, policy.max_replicas, now, f"above maxReplicas={policy.max_replicas}"
        )
    since_last = math.inf if state.last_scale_at is None else now - state.last_scale_at
    if sustained_high:
        return _maybe_scale_out(policy, state, min(pressures), since_last, now)
    if sustained_low:
        return _maybe_scale_in(policy, state, max(pressures), since_last, now)
    if len(pressures) < MIN_SAMPLES:
        return Decision("hold", state, f"{len(pressures)} samples in window, need {MIN_SAMPLES}")
    return Decision(
        "hold", state, f"pressure {min(pressures):.2f}..{max(pressures):.2f} within band"
    )


def _scale_to(state: PoolState, replicas: int, now: float, reason: str) -> Decision:
    new_state = PoolState(replicas=replicas, last_scale_at=now)
    return Decision("scale_out", new_state, f"{state.replicas}->{replicas}: {reason}")


def _begin_drain(state: PoolState, target: int, now: float, reason: str) -> Decision:
    new_state = replace(state, drain=Drain(target_replicas=target, since=now))
    return Decision("begin_drain", new_state, f"draining {state.replicas}->{target}: {reason}")


def _maybe_scale_out(
    policy: Policy, state: PoolState, level: float, since_last: float, now: float
) -> Decision:
    if state.replicas >= policy.max_replicas:
        return Decision(
            "hold", state, f"pressure {level:.2f} but at maxReplicas={policy.max_replicas}"
        )
    if since_last < policy.scale_out_cooldown_seconds:
        left = policy.scale_out_cooldown_seconds - since_last
        return Decision("hold", state, f"pressure {level:.2f}, scale-out cooldown {left:.0f}s left")
    wanted = max(state.replicas + 1, math.ceil(state.replicas * level))
    target = min(policy.max_replicas, state.replicas + policy.max_step, wanted)
    return _scale_to(state, target, now, f"pressure {level:.2f} > 1 for the whole window")


def _maybe_scale_in(
    policy: Policy, state: PoolState, level: float, since_last: float, now: float
) -> Decision:
    if state.replicas <= policy.min_replicas:
        return Decision(
            "hold", state, f"pressure {level:.2f} but at minReplicas={policy.min_replicas}"
        )
    if since_last < policy.scale_in_cooldown_seconds:
        left = policy.scale_in_cooldown_seconds - since_last
        return Decision("hold", state, f"pressure {level:.2f}, scale-in cooldown {left:.0f}s left")
    reason = f"pressure {level:.2f} < {policy.scale_in_below} for the whole window"
    return _begin_drain(state, state.replicas - 1, now, reason)


def _continue_drain(policy: Policy, state: PoolState, sustained_high: bool, now: float) -> Decision:
    drain = state.drain
    assert drain is not None  # checked by the caller
    if sustained_high:
        new_state = replace(state, drain=None)
        return Decision(
            "cancel_drain", new_state, f"load returned while draining to {drain.target_replicas}"
        )
    elapsed = now - drain.since
    if elapsed < policy.drain_seconds:
        left = policy.drain_seconds - elapsed
        return Decision("hold", state, f"draining to {drain.target_replicas}, {left:.0f}s left")
    new_state = PoolState(replicas=drain.target_replicas, last_scale_at=now)
    return Decision("finish_drain", new_state, f"drained {state.replicas}->{drain.target_replicas}")
