"""Decode runs: many identical-shape decode steps of a simulated rank as one clock event.

A run is planned only when every running request decodes, none is waiting and no step needs
a page: then the steps are exactly what single steps would do. An arrival cuts the run at the
end of the step in flight, as it would join a single step's successor. With overlapped decode
(`hardware.decode_overlap`, sim_rank.py) each step after the first hides its host work behind
the chip time of the step before, as single steps do.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.cost_model import CostModel, StepWork
from .sim_clock import ScheduledEvent
from .sim_request import SimRequest


@dataclass
class DecodeRun:
    """Decode steps of a fixed batch scheduled as one event; `ends` holds each step's end."""

    requests: list[SimRequest]
    ends: list[float]
    steps: int
    event: ScheduledEvent | None = None
    started_s: float = 0.0  # when the first step began (the rank's step log)

    @property
    def end_s(self) -> float:
        """When the run's last kept step ends."""
        return self.ends[self.steps - 1]

    def cut_after(self, now: float) -> tuple[int, float] | None:
        """Keep the steps up to the one in flight at `now`.

        Returns the steps and seconds given up, or None when the run keeps every step.
        """
        done = sum(1 for end in self.ends[: self.steps] if end <= now)
        keep = min(self.steps, done + 1)
        if keep == self.steps:
            return None
        dropped = (self.steps - keep, self.ends[self.steps - 1] - self.ends[keep - 1])
        self.steps = keep
        return dropped


def plan_decode_run(
    running: list[SimRequest],
    costs: CostModel,
    now: float,
    max_steps: int,
    overlap: bool = False,
    hidden_s: float = 0.0,
) -> DecodeRun | None:
    """Up to `max_steps` decode steps of `running` from `now`, or None when fewer than two
    steps can run as one (a prefill runs, a request ends or a step needs a page sooner).
    `overlap`: a step's host work runs during the step before's chip time (the first step's:
    `hidden_s` of it already has)."""
    if max_steps < 2 or not running or not all(r.context_done for r in running):
        return None
    steps = min(
        max_steps,
        min(r.max_tokens - r.generated for r in running),
        min(r.pages_tokens - r.computed for r in running),
    )
    if steps < 2:
        return None
    contexts = tuple(r.computed for r in running)
    ends = []
    for offset in range(steps):
        work = StepWork(decode_contexts=tuple(c + offset for c in contexts))
        seconds = costs.step_seconds(work)
        if overlap:
            host_s = costs.host_seconds(seconds)
            chip_s = seconds - host_s
            seconds = host_s - min(host_s, hidden_s) + chip_s
            hidden_s = chip_s  # the next step's host work runs meanwhile
        now += seconds
        ends.append(now)
    return DecodeRun(list(running), ends, steps)
