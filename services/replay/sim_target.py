"""The `sim` target: a simulated fleet behind the replay's Target interface, on virtual time.

Spec: `sim`, `sim:PATH.yaml`, either with `?key=value&...` fleet overrides (see sim_config).
The driver paces sessions on the target's clock, which is the fleet's virtual clock, so think
times of hours cost nothing and TTFT is the simulated one. Reused tokens are what the rank's
real kvstore matched when it admitted the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .prompt_layout import PromptLayout
from .records import Generation
from .sim_clock import VirtualClock
from .sim_config import SimConfig, load_sim_config, parse_sim_spec
from .sim_fleet import SimFleet
from .target_types import TargetError, TargetInfo, TargetOptions


class SimTarget:
    """Generates on a simulated fleet; `aclose` checks every invariant of the fleet."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.clock = VirtualClock()
        self.fleet = SimFleet(config, self.clock)

    async def describe(self) -> TargetInfo:
        """Any token id will do (blocks are hashed, not embedded); the context is the fleet's."""
        return TargetInfo(max_model_len=self.config.fleet.max_context_tokens)

    async def generate(
        self,
        conversation_id: str,
        tokens: list[int],
        max_tokens: int,
        branch_hints: Sequence[int] = (),
        layout: PromptLayout | None = None,  # token ids need no layout
    ) -> Generation:
        """Run one request through router admission and its rank; raise TargetError on failure."""
        request = await self.fleet.generate(conversation_id, tokens, max_tokens, branch_hints)
        if request.error is not None:
            raise TargetError(request.error)
        times = tuple(request.token_times)
        return Generation(
            prompt_tokens=request.prompt_len,
            cached_tokens=request.cached_tokens or 0,
            output_tokens=request.generated,
            first_token_s=times[0],
            token_times_s=times,
            finish_s=times[-1],
            rank=request.rank_id,
        )

    def stats(self) -> dict[str, Any]:
        """Counters of the run: passes, deferrals, placements, preemptions, retained
        conversations released under pressure, steps, events."""
        ranks = self.fleet.ranks.values()
        return {
            "passes": self.fleet.passes,
            "deferrals": self.fleet.deferrals,
            "placements": dict(sorted(self.fleet.placements.items())),
            "preemptions": sum(rank.preemptions for rank in ranks),
            "released_conversations": sum(rank.released_conversations for rank in ranks),
            "steps": sum(rank.steps for rank in ranks),
            "busy_s": sum(rank.busy_s for rank in ranks),
            "prefill_busy_s": sum(rank.prefill_busy_s for rank in ranks),
            "events": self.clock.events_fired,
        }

    async def aclose(self) -> None:
        """Stop the clock, then check the admission store and every rank's kvstore (raises
        when they don't add up)."""
        self.clock.close()
        self.fleet.close_step_logs()
        self.fleet.check_integrity()


def open_sim_target(spec: str, options: TargetOptions) -> SimTarget:
    """Build the fleet a `sim[:PATH][?k=v...]` spec describes."""
    del options  # the model name and request timeout mean nothing on virtual time
    path, overrides = parse_sim_spec(spec)
    return SimTarget(load_sim_config(path, overrides))
