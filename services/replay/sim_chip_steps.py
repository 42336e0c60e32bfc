"""What both models of a shared chip keep: the steps in flight, their work left, their
callbacks, the one clock event pending and the chip's busy time (sim_chip.py,
sim_sliced_chip.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from .sim_clock import ScheduledEvent, VirtualClock

# Seconds of chip work below which a step counts as done (float remainder of the sharing).
DONE_S = 1e-12


class ChipSteps:
    """The steps on one chip; a subclass is the only writer of their remaining work."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
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

    def _add(self, chip_seconds: float, done: Callable[[], None]) -> int:
        """A new step's key, its work and callback recorded."""
        key = next(self._ids)
        self._left[key] = chip_seconds
        self._done[key] = done
        return key

    def _cancel_event(self) -> None:
        if self._event is not None:
            self._event.cancel()
            self._event = None
