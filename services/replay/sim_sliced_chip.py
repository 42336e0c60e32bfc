"""One accelerator that several simulated ranks share, run by time slices (`SlicedChip`).

The GPU's time-slice scheduler runs one context at a time: steps wait in arrival order; the
first runs at full speed until it ends or, while others wait, until its slice of `slice_s`
ends, then goes to the back. A step's kernels are not cut: with `kernel_s` (a prefill chunk's
kernels are long) its slice ends at the first kernel boundary after the slice's end. A slice
counts from when the step got the chip and renews while no other step waits. Each hand-over
from one step to another costs the step that gets the chip `switch_s` more chip time.
Selected by `hardware.chip_slice_ms` > 0 (with `chip_prefill_kernels`; fitted on hardware step
logs by bench/chip_sharing.py --slices); `SharedChip` (sim_chip.py) is the default.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .sim_chip_steps import DONE_S, ChipSteps
from .sim_clock import VirtualClock


class SlicedChip(ChipSteps):
    """Steps in flight on one chip, run in turn; the only writer of their remaining work."""

    def __init__(
        self, clock: VirtualClock, slice_s: float, prefill_kernels: int = 0, switch_s: float = 0.0
    ) -> None:
        super().__init__(clock)
        self.slice_s = slice_s
        self.switch_s = switch_s
        self.prefill_kernels = prefill_kernels  # a prefill step's chip time in that many kernels
        self._order: deque[int] = deque()  # steps in turn; the first has the chip
        self._kernel: dict[int, float] = {}  # step -> its kernels' chip seconds (0: cut anywhere)
        self._total: dict[int, float] = {}  # step -> its chip seconds
        self._got_s = 0.0  # when the first step got the chip
        self._switch_due = 0.0  # hand-over time the first step has still to pay
        self._slice_due = float("inf")  # when the first step's slice ends

    def run(self, chip_seconds: float, done: Callable[[], None], kernel_s: float = 0.0) -> None:
        """Compute a step of `chip_seconds` (its time alone on the chip) made of kernels of
        `kernel_s` (0: cut anywhere), then call `done`."""
        self._advance()
        key = self._add(chip_seconds, done)
        self._total[key] = chip_seconds
        self._kernel[key] = kernel_s
        self._order.append(key)
        if len(self._order) == 1:
            self._got_s = self.clock.now()
        self._schedule()

    def _advance(self) -> None:
        """Charge the time since the last change to the step that has the chip."""
        now = self.clock.now()
        if self._left:
            paid = min(now - self._updated_s, self._switch_due)
            self._switch_due -= paid
            self._left[self._order[0]] -= now - self._updated_s - paid
            self.busy_s += now - self._updated_s
        self._updated_s = now

    def _slice_end(self) -> float:
        """When the first step's slice ends (its current one, renewed while it ran alone),
        moved to the end of the kernel it is then in."""
        now = self.clock.now()
        turns = max(1, -(-(now - self._got_s - DONE_S) // self.slice_s))
        end = max(now, self._got_s + turns * self.slice_s)
        first = self._order[0]
        kernel = self._kernel[first]
        if kernel > 0:
            done_then = (
                self._total[first] - self._left[first] + max(0.0, end - now - self._switch_due)
            )
            into = done_then % kernel
            if into > DONE_S and kernel - into > DONE_S:
                end += kernel - into
        return end

    def _schedule(self) -> None:
        """One clock event: when the first step ends or, while others wait, its slice does."""
        self._cancel_event()
        if self._left:
            when = self.clock.now() + self._switch_due + max(self._left[self._order[0]], 0.0)
            self._slice_due = self._slice_end() if len(self._order) > 1 else float("inf")
            self._event = self.clock.call_at(min(when, self._slice_due), self._turn_due)

    def _turn_due(self) -> None:
        """The first step ended or its slice did; the chip goes to the next in turn."""
        self._event = None
        self._advance()
        now = self.clock.now()
        first = self._order[0]
        callbacks = []
        if self._switch_due <= DONE_S and self._left[first] <= DONE_S:
            self._order.popleft()
            for table in (self._left, self._total, self._kernel):
                del table[first]
            callbacks.append(self._done.pop(first))
        elif len(self._order) > 1 and now >= self._slice_due - DONE_S:
            self._order.rotate(-1)
        if self._order and self._order[0] != first:
            self._got_s = now
            self._switch_due = self.switch_s
        elif not self._order:
            self._switch_due = 0.0
        self._schedule()
        # NOTE: a callback starts that rank's next step (run), which reschedules again.
        for callback in callbacks:
            callback()
