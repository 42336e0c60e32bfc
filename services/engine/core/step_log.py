"""A rank's step log: one JSON line per engine step, what it computed and how long it took.

Each line: `t` (wall clock at the step's start, seconds since the epoch, so the logs of ranks
sharing a GPU line up), `s` (the step's seconds, as `kvfleet_engine_step_seconds` measures
them), `prefill` ([start, end) token spans of prompt chunks), `decode` (each decoding
sequence's context length), `host_in` / `disk_in` (pages the KV tiers onboarded since the
step before), `disk_out` (pages written to the disk tier since the step before), `waiting`
(requests still waiting at the rank after this step's plan), `ahead` (the step was planned
while the one before ran on the device: `lookahead.py`) and `plan` (the scheduler's seconds
planning it, which end where `t` starts: part of the pause before the step). The first
four are the cost model's `StepWork`, so `bench/step_costs.py` prices every logged step with
a simulator's hardware figures and compares (docs/sim-vs-live.md).
Written by the core thread only; off unless `EngineConfig.step_log_path` is set.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ....kvstore.tiers.metrics import DISK
from ...core.cost_model import StepWork
from ...core.step_line import step_line
from ..compute.step_work import OnboardedPages, step_work
from ..request.scheduled_chunk import ScheduledChunk


class StepLog:
    """Appends each step's work and seconds to a JSON-lines file."""

    def __init__(self, path: str | Path, tier_metrics: Mapping) -> None:
        self._file = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._tiers = tier_metrics
        self._onboarded = OnboardedPages(tier_metrics)
        self._written = tier_metrics[DISK].pages_in  # pages written to disk so far
        self._pending: tuple[float, StepWork, int, tuple[int, bool], float] = (
            0.0,
            StepWork(),
            0,
            (0, False),
            0.0,
        )

    def before(
        self, chunks: Sequence[ScheduledChunk], waiting: int, ahead: bool, planned: float
    ) -> None:
        """A step is about to run these chunks (read now: running them moves the sequences),
        with `waiting` requests left waiting, planned `ahead` of the step before's tokens in
        `planned` seconds."""
        host, disk = self._onboarded.since_last()
        now = self._tiers[DISK].pages_in
        written, self._written = now - self._written, now
        work = step_work(chunks, host, disk)
        self._pending = (time.time(), work, written, (waiting, ahead), planned)

    def after(self, seconds: float) -> None:
        """The step begun last took `seconds`."""
        started, work, written, queue, planned = self._pending
        self._file.write(step_line(started, seconds, work, written, queue, planned))

    def close(self) -> None:
        """Flush and close (the core has stopped stepping)."""
        self._file.close()
