"""A simulated rank's step log: the engine's step-log lines, on the virtual clock.

`fleet.step_log: DIR` makes every rank write `DIR/steps-<rank>.jsonl`, one line per step in
the engine's format (services/core/step_line.py; `t` is virtual seconds), so
`bench/step_mix.py` compares the steps the simulator ran with a fleet's logged steps.
A decode run (several decode steps as one event) is written as its single steps.
"""

from __future__ import annotations

from pathlib import Path

from ..core.cost_model import StepWork
from ..core.step_line import step_line


class SimStepLog:
    """Appends each step of one rank to a JSON-lines file."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = Path(path).open("w", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def step(self, started: float, ended: float, work: StepWork) -> None:
        """One step of `work` from `started` to `ended` (virtual seconds)."""
        self._file.write(step_line(started, ended - started, work))

    def decode_run(self, started: float, ends: list[float], contexts: tuple[int, ...]) -> None:
        """A decode run's steps: the i-th decodes `contexts` + i and ends at `ends[i]`."""
        for offset, ended in enumerate(ends):
            work = StepWork(decode_contexts=tuple(c + offset for c in contexts))
            self.step(started, ended, work)
            started = ended

    def close(self) -> None:
        """Flush and close (the replay has ended)."""
        self._file.close()
