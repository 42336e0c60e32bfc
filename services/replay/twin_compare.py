"""One arm replayed twice, on the simulator and on its live twin; the difference in points.

Both runs get the same conversations, synthesised tokens (seed, the live model's vocabulary)
and pacing; each is measured against the oracle of what it ran. The sim runs first, on its
virtual clock in its own event loop, then the live fleet on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .driver import DriverOptions
from .live_twin import LiveTwin, TwinSettings
from .measures import ReplayMeasures
from .model import Conversation
from .readers import ReadOptions, filter_max_model_len, read_traces
from .records import RequestRecord
from .runner import ArmResult, run_arm
from .sim_config import SimConfig
from .sim_target import SimTarget
from .tokens import TokenSynthesizer


class ReplayFailed(RuntimeError):
    """Requests of a comparison run failed, so its measures would not compare like for like."""


@dataclass(frozen=True)
class ArmComparison:
    """The simulator's and the live fleet's measures of one arm."""

    name: str
    sim: ReplayMeasures
    live: ReplayMeasures
    sim_records: tuple[RequestRecord, ...] = ()
    live_records: tuple[RequestRecord, ...] = ()

    @property
    def reuse_difference_points(self) -> float:
        """Sim minus live prefix reuse, in percentage points."""
        return 100 * (self.sim.prefix_reuse - self.live.prefix_reuse)

    @property
    def no_reuse_difference_points(self) -> float:
        """Sim minus live share of later turns with no reuse, in percentage points."""
        return 100 * (self.sim.later_turns_no_reuse - self.live.later_turns_no_reuse)

    def turn_disagreements(self) -> list[TurnDisagreement]:
        """Turns whose reused tokens differ between the two runs, in conversation order."""
        live = {(r.conversation_id, r.turn_index): r for r in self.live_records}
        found = []
        for record in sorted(self.sim_records, key=lambda r: (r.conversation_id, r.turn_index)):
            key = (record.conversation_id, record.turn_index)
            other = live.get(key)
            if other is not None and other.reused_tokens != record.reused_tokens:
                found.append(
                    TurnDisagreement(
                        *key, record.prompt_tokens, record.reused_tokens, other.reused_tokens
                    )
                )
        return found


@dataclass(frozen=True)
class TurnDisagreement:
    """One turn that reused a different number of tokens on the simulator and live."""

    conversation_id: str
    turn_index: int
    prompt_tokens: int
    sim_reused: int
    live_reused: int


@dataclass(frozen=True)
class Workload:
    """What both runs replay and how it is paced."""

    conversations: Sequence[Conversation]
    synthesizer: TokenSynthesizer
    options: DriverOptions


def multi_turn_slice(
    trace: Path, max_model_len: int, min_turns: int, limit: int, max_turns: int | None = None
) -> list[Conversation]:
    """The first `limit` conversations of `trace` with at least `min_turns` turns once turns
    longer than `max_model_len` (prompt + output) are dropped, cut to their first `max_turns`
    steps (for traces without sub-agents: turns)."""
    conversations = filter_max_model_len(read_traces([trace], ReadOptions()), max_model_len)
    chosen = [
        replace(c, steps=c.steps[:max_turns])
        for c in conversations
        if c.request_count() >= min_turns
    ][:limit]
    if len(chosen) < limit:
        raise ValueError(
            f"{trace}: {len(chosen)} conversations with >= {min_turns} turns under "
            f"{max_model_len} tokens, {limit} wanted"
        )
    return chosen


async def _replay_sim(name: str, sim: SimConfig, workload: Workload) -> ArmResult:
    target = SimTarget(sim)
    try:
        return await run_arm(
            name,
            target,
            workload.conversations,
            workload.synthesizer,
            workload.options,
            {"target": "sim", "fleet": sim.to_json()["fleet"]},
        )
    finally:
        await target.aclose()


async def _replay_live(twin: LiveTwin, name: str, workload: Workload) -> ArmResult:
    target = twin.target()
    try:
        return await run_arm(
            name,
            target,
            workload.conversations,
            workload.synthesizer,
            workload.options,
            {"target": target.address, "engine": repr(twin.engine)},
        )
    finally:
        await target.aclose()


def _checked(result: ArmResult, side: str) -> ReplayMeasures:
    if result.errors:
        first = result.errors[0]
        raise ReplayFailed(
            f"{side} {result.name}: {len(result.errors)} of {len(result.records)} requests "
            f"failed; first: {first.conversation_id} turn {first.turn_index}: {first.error}"
        )
    return result.measures


def compare_arm(
    name: str, sim: SimConfig, workload: Workload, settings: TwinSettings | None = None
) -> ArmComparison:
    """Replay `workload` on the simulated arm, then on its live twin; raise ReplayFailed when
    a request failed on either side and TwinMismatch when the arm cannot be mirrored."""
    twin = LiveTwin(sim, settings)  # NOTE: built first, so a mismatch fails before any run
    sim_result = asyncio.run(_replay_sim(name, sim, workload))
    sim_measures = _checked(sim_result, "sim")
    twin.start()
    try:
        live_result = asyncio.run(_replay_live(twin, name, workload))
    finally:
        twin.close()
    live_measures = _checked(live_result, "live")
    return ArmComparison(
        name, sim_measures, live_measures, tuple(sim_result.records), tuple(live_result.records)
    )
