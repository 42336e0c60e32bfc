"""One accelerator that several simulated ranks share, as engine processes on one GPU do.

Without MPS the processes' kernels take turns on the whole chip (time slicing), so a rank's
decode step waits behind other ranks' long prefill chunks. The chip is modelled as processor
sharing: while k steps are in flight, each progresses at 1/k of the chip's speed, so a step
alone takes its full-chip time and k identical steps together take k times as long. A step's
host work (Python, launches: the cost model's step overhead) is each process's own and is
not shared. A step that starts while another rank's step is on the chip costs `switch_s` more
chip time (`hardware.chip_switch_ms`): its context has to be switched in, which a step alone
does not pay (fitted on hardware step logs by bench/chip_sharing.py).

With `slice_s` > 0 the chip runs one step at a time instead, as the GPU's time-slice
scheduler runs one context at a time (`hardware.chip_slice_ms`, `chip_prefill_kernels`, fitted
on the step logs by bench/chip_sharing.py --slices): steps wait in arrival order; the first runs
at full speed until it ends or, while others wait, until its slice of `slice_s` ends, then goes
to the back. A step's kernels are not cut: with `kernel_s` (a prefill chunk's kernels are long)
its slice ends at the first kernel boundary after the slice's end. A slice counts from when the
step got the chip and renews while no other step waits. Each hand-over from one step to another
costs the step that gets the chip `switch_s` more chip time.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from .sim_clock import ScheduledEvent, VirtualClock

# Seconds of chip work below which a step counts as done (float remainder of the sharing).
_DONE_S = 1e-12


class SharedChip:
    """Steps in flight on one chip; the only writer of their remaining work."""

    def __init__(
        self, clock: VirtualClock, switch_s: float = 0.0, slice_s: float = 0.0,
        prefill_kernels: int = 0,
    ) -> None:  # fmt: skip
        self.clock = clock
        self.switch_s = switch_s
        self.slice_s = slice_s
        # slices: a prefill step's chip time in that many kernels (0: cut anywhere)
        self.prefill_kernels = prefill_kernels
        self._order: deque[int] = deque()  # slices: steps in turn; the first has the chip
        self._kernel: dict[int, float] = {}  # slices: step -> its kernels' chip seconds
        self._total: dict[int, float] = {}  # slices: step -> its chip seconds
        self._got_s = 0.0  # slices: when the first step got the chip
        self._switch_due = 0.0  # slices: hand-over time the first step has still to pay
        self._slice_due = float("inf")  # slices: when the first step's slice ends
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
        a step that joins others on the chip costs `switch_s` more (with slices: each time
        it gets the chip from another step). `kernel_s`: with slices, the step's kernels."""
        self._advance()
        key = next(self._ids)
        self._done[key] = done
        if self.slice_s > 0:
            self._left[key] = chip_seconds
            self._total[key] = chip_seconds
            self._kernel[key] = kernel_s
            self._order.append(key)
            if len(self._order) == 1:
                self._got_s = self.clock.now()
        else:
            self._left[key] = chip_seconds + (self.switch_s if self._left else 0.0)
        self._schedule()

    def _advance(self) -> None:
        """Charge the time since the last change to every step in flight, shared equally
        (with slices: all of it to the step that has the chip)."""
        now = self.clock.now()
        if self._left and self.slice_s > 0:
            paid = min(now - self._updated_s, self._switch_due)
            self._switch_due -= paid
            self._left[self._order[0]] -= now - self._updated_s - paid
            self.busy_s += now - self._updated_s
        elif self._left:
            share = (now - self._updated_s) / len(self._left)
            for key in self._left:
                self._left[key] -= share
            self.busy_s += now - self._updated_s
        self._updated_s = now

    def _slice_end(self) -> float:
        """When the first step's slice ends (its current one, renewed while it ran alone),
        moved to the end of the kernel it is then in."""
        now = self.clock.now()
        turns = max(1, -(-(now - self._got_s - _DONE_S) // self.slice_s))
        end = max(now, self._got_s + turns * self.slice_s)
        first = self._order[0]
        kernel = self._kernel[first]
        if kernel > 0:
            done_then = (
                self._total[first] - self._left[first] + max(0.0, end - now - self._switch_due)
            )
            into = done_then % kernel
            if into > _DONE_S and kernel - into > _DONE_S:
                end += kernel - into
        return end

    def _schedule(self) -> None:
        """One clock event: when the step with the least work left ends at the current share
        (with slices: when the first step ends or, while others wait, its slice does)."""
        if self._event is not None:
            self._event.cancel()
            self._event = None
        if self._left and self.slice_s > 0:
            when = self.clock.now() + self._switch_due + max(self._left[self._order[0]], 0.0)
            self._slice_due = self._slice_end() if len(self._order) > 1 else float("inf")
            when = min(when, self._slice_due)
            self._event = self.clock.call_at(when, self._finish_due)
        elif self._left:
            soonest = max(min(self._left.values()), 0.0)
            when = self.clock.now() + soonest * len(self._left)
            self._event = self.clock.call_at(when, self._finish_due)

    def _finish_due(self) -> None:
        self._event = None
        self._advance()
        if self.slice_s > 0:
            self._turn_due()
            return
        due = [key for key, left in self._left.items() if left <= _DONE_S]
        callbacks = [self._done.pop(key) for key in due]
        for key in due:
            del self._left[key]
        self._schedule()
        # NOTE: a callback starts that rank's next step (run), which reschedules again.
        for callback in callbacks:
            callback()

    def _turn_due(self) -> None:
        """Slices: the first step ended or its slice did; the chip goes to the next in turn."""
        now = self.clock.now()
        first = self._order[0]
        callbacks = []
        if self._switch_due <= _DONE_S and self._left[first] <= _DONE_S:
            self._order.popleft()
            for table in (self._left, self._total, self._kernel):
                del table[first]
            callbacks.append(self._done.pop(first))
        elif len(self._order) > 1 and now >= self._slice_due - _DONE_S:
            self._order.rotate(-1)
        if self._order and self._order[0] != first:
            self._got_s = now
            self._switch_due = self.switch_s
        elif not self._order:
            self._switch_due = 0.0
        self._schedule()
        for callback in callbacks:
            callback()
