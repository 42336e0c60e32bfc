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

import itertools
from collections.abc import Callable

from ..core.cost_figures import Hardware
from .sim_clock import ScheduledEvent, VirtualClock
from .sim_sliced_chip import SlicedChip

# Seconds of chip work below which a step counts as done (float remainder of the sharing).
_DONE_S = 1e-12


class SharedChip:
    """Steps in flight on one chip; the only writer of their remaining work."""

    prefill_kernels = 0  # a step's kernels do not matter here: every step progresses at once

    def __init__(self, clock: VirtualClock, switch_s: float = 0.0) -> None:
        self.clock = clock
        self.switch_s = switch_s
        self._left: dict[int, float] = {}  # step -> seconds of full-chip work still to do
        self._done: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._updated_s = clock.now()
        self._event: ScheduledEvent | None = None
        self.busy_s = 0.0  # time with at least one step in flight

    @property
    def in_flight(self) -> int:
        """Steps on the chip now."""
        return len(self._left)

    def run(self, chip_seconds: float, done: Callable[[], None], kernel_s: float = 0.0) -> None:
        """Compute a step of `chip_seconds` (its time alone on the chip), then call `done`;
        a step that joins others on the chip costs `switch_s` more (`kernel_s`: SlicedChip's)."""
        self._advance()
        key = next(self._ids)
        self._left[key] = chip_seconds + (self.switch_s if self._left else 0.0)
        self._done[key] = done
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
        if self._event is not None:
            self._event.cancel()
            self._event = None
        if self._left:
            soonest = max(min(self._left.values()), 0.0)
            when = self.clock.now() + soonest * len(self._left)
            self._event = self.clock.call_at(when, self._finish_due)

    def _finish_due(self) -> None:
        self._event = None
        self._advance()
        due = [key for key, left in self._left.items() if left <= _DONE_S]
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
