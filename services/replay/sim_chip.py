"""One accelerator that several simulated ranks share, as engine processes on one GPU do.

Without MPS the processes' kernels take turns on the whole chip (time slicing), so a rank's
decode step waits behind other ranks' long prefill chunks. The chip is modelled as processor
sharing: while k steps are in flight, each progresses at 1/k of the chip's speed, so a step
alone takes its full-chip time and k identical steps together take k times as long. A step's
host work (Python, launches: the cost model's step overhead) is each process's own and is
not shared. A step that starts while another rank's step is on the chip costs `switch_s` more
chip time (`hardware.chip_switch_ms`): its context has to be switched in, which a step alone
does not pay (fitted on hardware step logs by bench/chip_sharing.py). `SlicedChip`
(sim_sliced_chip.py) runs one step at a time by time slices instead; `make_chip` picks.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.cost_figures import Hardware
from .sim_chip_steps import DONE_S, ChipSteps
from .sim_clock import VirtualClock
from .sim_sliced_chip import SlicedChip


class SharedChip(ChipSteps):
    """Steps in flight on one chip, sharing it equally; the only writer of their remaining work."""

    prefill_kernels = 0  # a step's kernels do not matter here: every step progresses at once

    def __init__(self, clock: VirtualClock, switch_s: float = 0.0) -> None:
        super().__init__(clock)
        self.switch_s = switch_s

    def run(self, chip_seconds: float, done: Callable[[], None], kernel_s: float = 0.0) -> None:
        """Compute a step of `chip_seconds` (its time alone on the chip), then call `done`;
        a step that joins others on the chip costs `switch_s` more (`kernel_s`: SlicedChip's)."""
        self._advance()
        self._add(chip_seconds + (self.switch_s if self._left else 0.0), done)
        self._schedule()

    def _advance(self) -> None:
        """Charge the time since the last change to every step in flight, shared equally."""
        now = self.clock.now()
        if self._left:
            share = (now - self._updated_s) / len(self._left)
            for key in self._left:
                self._left[key] -= share
            self.busy_s += now - self._updated_s
        self._updated_s = now

    def _schedule(self) -> None:
        """One clock event: when the step with the least work left ends at the current share."""
        self._cancel_event()
        if self._left:
            soonest = max(min(self._left.values()), 0.0)
            when = self.clock.now() + soonest * len(self._left)
            self._event = self.clock.call_at(when, self._finish_due)

    def _finish_due(self) -> None:
        self._event = None
        self._advance()
        due = [key for key, left in self._left.items() if left <= DONE_S]
        callbacks = [self._done.pop(key) for key in due]
        for key in due:
            del self._left[key]
        self._schedule()
        # NOTE: a callback starts that rank's next step (run), which reschedules again.
        for callback in callbacks:
            callback()


Chip = SharedChip | SlicedChip  # what a rank computes its steps on when ranks share a chip


def make_chip(clock: VirtualClock, hardware: Hardware) -> Chip:
    """The chip the hardware figures describe: time slices where `chip_slice_ms` > 0, else
    processor sharing."""
    switch_s = hardware.chip_switch_ms / 1e3
    if hardware.chip_slice_ms > 0:
        slice_s = hardware.chip_slice_ms / 1e3
        return SlicedChip(clock, slice_s, hardware.chip_prefill_kernels, switch_s)
    return SharedChip(clock, switch_s)
